// wasirun runs a wasip1 command module (a Go test binary built for
// GOOS=wasip1) under Node.js's V8: `node --no-liftoff wasirun.mjs MODULE
// ARGS...`. --no-liftoff runs it as Envoy configures V8 (TurboFan only).
import { readFileSync } from 'node:fs';
import { WASI } from 'node:wasi';

const [module, ...args] = process.argv.slice(2);
const wasi = new WASI({ version: 'preview1', args: [module, ...args], env: { HOME: '/tmp' }, returnOnExit: true });
const instance = new WebAssembly.Instance(new WebAssembly.Module(readFileSync(module)), wasi.getImportObject());
process.exitCode = wasi.start(instance);
