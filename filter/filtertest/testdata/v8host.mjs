// v8host runs the filter's compiled module under V8, the engine Envoy
// embeds, with a proxy-wasm ABI v0.2.1 host written for it: the calls a
// lease hit and a callout make, with the semantics wasmhost gives them
// (wasmhost is the reference; this host is a second, independent one).
// V8 runs as Envoy configures it (proxy-wasm-cpp-host's v8.cc): TurboFan
// only, no Liftoff — run it as `node --no-liftoff v8host.mjs < spec.json`.
//
// The spec (JSON on stdin) names the module, the plugin configurations and
// the requests; the answer (JSON on stdout) holds the time a request took
// in each scenario and what the filter did, for filtertest to check. Any
// departure from the expected ABI use is an error on stderr and exit 1.
import { readFileSync } from 'node:fs';
import { WASI } from 'node:wasi';

const spec = JSON.parse(readFileSync(0, 'utf8'));
const enc = new TextEncoder();
const latin1 = new TextDecoder('latin1');

// Status codes, map and buffer types of ABI v0.2.1.
const OK = 0, NOT_FOUND = 1, BAD_ARGUMENT = 2, CAS_MISMATCH = 8;
const REQUEST_HEADERS = 0, RESPONSE_HEADERS = 2, CALL_RESPONSE_HEADERS = 6;
const CALL_RESPONSE_BODY = 4, VM_CONFIGURATION = 6, PLUGIN_CONFIGURATION = 7;
const CONTINUE = 0;
const ROOT = 1;

function fail(msg) {
  process.stderr.write(`v8host: ${msg}\n`);
  process.exit(1);
}

// One VM: a module instance with its host state. Shared data and metrics
// are per VM here (one VM per run).
class VM {
  constructor(module, pluginConfig) {
    this.pluginConfig = enc.encode(pluginConfig);
    this.shared = new Map(); // key -> {value: Uint8Array, cas}
    this.casSeq = 0;
    this.metrics = []; // {name, value}
    this.metricIds = new Map();
    this.streams = new Map(); // context id -> stream
    this.callouts = new Map(); // token -> {contextID}
    this.nextToken = 0;
    this.effective = ROOT;
    this.callBody = null; // the body of the callout answer being delivered
    this.callHeaders = null;
    this.logs = [];
    const wasi = new WASI({ version: 'preview1', args: [], env: {}, returnOnExit: true });
    const imports = { wasi_snapshot_preview1: wasi.wasiImport, env: this.env() };
    this.instance = new WebAssembly.Instance(module, imports);
    this.x = this.instance.exports;
    this.mem = this.x.memory;
    wasi.initialize(this.instance);
    this.x.proxy_on_context_create(ROOT, 0);
    if (!this.x.proxy_on_vm_start(ROOT, 0)) fail('proxy_on_vm_start failed: ' + this.logs.join('; '));
    if (!this.x.proxy_on_configure(ROOT, this.pluginConfig.length)) fail('proxy_on_configure failed: ' + this.logs.join('; '));
  }

  // bytes and view are the guest memory's views, made again only when the
  // memory grew (growing detaches the old buffer).
  bytes() {
    if (this.buf !== this.mem.buffer) this.remap();
    return this.u8;
  }
  view() {
    if (this.buf !== this.mem.buffer) this.remap();
    return this.dv;
  }
  remap() {
    this.buf = this.mem.buffer;
    this.u8 = new Uint8Array(this.buf);
    this.dv = new DataView(this.buf);
  }
  // str reads len bytes at ptr as Latin-1 (header names and values are
  // bytes): short ones a character at a time, cheaper than a decoder call.
  str(ptr, len) {
    const b = this.bytes();
    if (len > 64) return latin1.decode(b.subarray(ptr, ptr + len));
    let s = '';
    for (let i = ptr; i < ptr + len; i++) s += String.fromCharCode(b[i]);
    return s;
  }

  // give copies data into memory the guest allocates and writes its
  // address and size to the out-parameters.
  give(data, ptrOut, sizeOut) {
    let ptr = 0;
    if (data.length > 0) {
      ptr = this.x.proxy_on_memory_allocate(data.length);
      if (ptr === 0) return BAD_ARGUMENT;
      this.bytes().set(data, ptr); // after the allocation: it may grow memory
    }
    const v = this.view();
    v.setUint32(ptrOut, ptr, true);
    v.setUint32(sizeOut, data.length, true);
    return OK;
  }

  giveMap(pairs, ptrOut, sizeOut) { return this.give(serialise(pairs), ptrOut, sizeOut); }

  decodeMap(ptr, len) {
    const v = this.view();
    const n = v.getUint32(ptr, true);
    const out = [];
    let at = ptr + 4 + 8 * n;
    for (let i = 0; i < n; i++) {
      const kl = v.getUint32(ptr + 4 + 8 * i, true), vl = v.getUint32(ptr + 8 + 8 * i, true);
      const k = this.str(at, kl); at += kl + 1;
      const val = this.str(at, vl); at += vl + 1;
      out.push([k, val]);
    }
    if (at > ptr + len) fail('a header map ran past its buffer');
    return out;
  }

  stream() { return this.streams.get(this.effective); }

  headerMap(type) {
    const s = this.stream();
    if (type === CALL_RESPONSE_HEADERS) return this.callHeaders;
    if (!s) return null;
    if (type === REQUEST_HEADERS) return s.request;
    if (type === RESPONSE_HEADERS) return s.response;
    return null;
  }

  env() {
    const vm = this;
    return {
      proxy_log(level, ptr, len) {
        const msg = vm.str(ptr, len);
        if (level >= 3) vm.logs.push(msg); // warn and up
        return OK;
      },
      proxy_get_buffer_bytes(type, start, max, ptrOut, sizeOut) {
        let buf;
        if (type === PLUGIN_CONFIGURATION) buf = vm.pluginConfig;
        else if (type === CALL_RESPONSE_BODY && vm.callBody) buf = vm.callBody;
        else if (type === VM_CONFIGURATION) buf = new Uint8Array(0);
        else return NOT_FOUND;
        return vm.give(buf.subarray(start, start + max), ptrOut, sizeOut);
      },
      proxy_get_header_map_pairs(type, ptrOut, sizeOut) {
        const s = vm.stream();
        if (type === REQUEST_HEADERS && s && s.requestBytes) return vm.give(s.requestBytes, ptrOut, sizeOut);
        const m = vm.headerMap(type);
        if (!m) return BAD_ARGUMENT;
        return vm.giveMap(m, ptrOut, sizeOut);
      },
      proxy_set_header_map_pairs(type, ptr, len) {
        const s = vm.stream();
        if (!s || (type !== REQUEST_HEADERS && type !== RESPONSE_HEADERS)) return BAD_ARGUMENT;
        const pairs = vm.decodeMap(ptr, len).map(([k, v]) => [k.toLowerCase(), v]);
        if (type === REQUEST_HEADERS) s.request = pairs; else s.response = pairs;
        return OK;
      },
      proxy_replace_header_map_value(type, kp, kl, vp, vl) {
        const m = vm.headerMap(type);
        if (!m) return BAD_ARGUMENT;
        const k = vm.str(kp, kl).toLowerCase(), val = vm.str(vp, vl);
        vm.edited(type);
        let i = 0;
        while (i < m.length && m[i][0] !== k) i++;
        if (i === m.length) {
          m.push([k, val]);
          return OK;
        }
        m[i] = [k, val];
        for (let j = m.length - 1; j > i; j--) if (m[j][0] === k) m.splice(j, 1);
        return OK;
      },
      proxy_remove_header_map_value(type, kp, kl) {
        const m = vm.headerMap(type);
        if (!m) return BAD_ARGUMENT;
        const k = vm.str(kp, kl).toLowerCase();
        vm.edited(type);
        for (let j = m.length - 1; j >= 0; j--) if (m[j][0] === k) m.splice(j, 1);
        return OK;
      },
      proxy_get_property(pp, pl, ptrOut, sizeOut) {
        const s = vm.stream();
        if (!s) return NOT_FOUND;
        const v = s.props.get(vm.str(pp, pl));
        if (v === undefined) return NOT_FOUND;
        return vm.give(v, ptrOut, sizeOut);
      },
      proxy_send_local_response(status, _dp, _dl, bp, bl, hp, hl) {
        const s = vm.stream();
        if (!s) return BAD_ARGUMENT;
        s.local = { status, headers: vm.decodeMap(hp, hl), body: vm.str(bp, bl) };
        return OK;
      },
      proxy_http_call(cp, cl, hp, hl, _bp, _bl, _tp, _tl, _timeout, tokenOut) {
        if (vm.str(cp, cl) !== 'controlsvc') return BAD_ARGUMENT;
        const h = vm.decodeMap(hp, hl);
        for (const need of [':method', ':path', ':authority']) {
          if (!h.some(([k, v]) => k === need && v !== '')) return BAD_ARGUMENT;
        }
        const token = ++vm.nextToken;
        vm.callouts.set(token, { contextID: vm.effective });
        vm.view().setUint32(tokenOut, token, true);
        return OK;
      },
      proxy_continue_stream(type) {
        const s = vm.stream();
        if (!s) return BAD_ARGUMENT;
        if (type === 0) s.resumed = true;
        return OK;
      },
      proxy_set_effective_context(id) {
        if (id !== ROOT && !vm.streams.has(id)) return BAD_ARGUMENT;
        vm.effective = id;
        return OK;
      },
      proxy_get_shared_data(kp, kl, ptrOut, sizeOut, casOut) {
        const e = vm.shared.get(vm.str(kp, kl));
        if (!e) return NOT_FOUND;
        const st = vm.give(e.value, ptrOut, sizeOut);
        if (st === OK) vm.view().setUint32(casOut, e.cas, true);
        return st;
      },
      proxy_set_shared_data(kp, kl, vp, vl, cas) {
        const key = vm.str(kp, kl);
        const e = vm.shared.get(key);
        // As cpp-host: a non-zero CAS is checked against an existing entry.
        if (e && cas !== 0 && e.cas !== cas) return CAS_MISMATCH;
        const src = vm.bytes().subarray(vp, vp + vl);
        if (e && e.value.length === vl) {
          e.value.set(src); // the same size: written in place
          e.cas = ++vm.casSeq;
        } else vm.shared.set(key, { value: src.slice(), cas: ++vm.casSeq });
        return OK;
      },
      proxy_set_tick_period_milliseconds() { return OK; },
      proxy_define_metric(_type, np, nl, idOut) {
        const name = vm.str(np, nl);
        let id = vm.metricIds.get(name);
        if (id === undefined) {
          id = vm.metrics.length;
          vm.metrics.push({ name, value: 0n });
          vm.metricIds.set(name, id);
        }
        vm.view().setUint32(idOut, id, true);
        return OK;
      },
      proxy_increment_metric(id, by) {
        const m = vm.metrics[id];
        if (!m || by <= 0n) return BAD_ARGUMENT;
        m.value += by;
        return OK;
      },
      proxy_record_metric(id, v) {
        const m = vm.metrics[id];
        if (!m) return BAD_ARGUMENT;
        m.value = v;
        return OK;
      },
    };
  }

  // edited drops a map's serialised form once the guest changes it.
  edited(type) {
    const s = this.stream();
    if (s && type === REQUEST_HEADERS) s.requestBytes = null;
  }

  // open starts a stream of request (a template: its serialised form and
  // properties are made once, as a proxy keeps its header map serialised
  // in native code).
  open(id, request) {
    this.streams.set(id, { request: request.pairs.slice(), requestBytes: request.bytes, response: null, props: request.props, resumed: false, local: null });
    this.x.proxy_on_context_create(id, ROOT);
  }

  requestHeaders(id) {
    this.effective = id;
    const s = this.streams.get(id);
    return this.x.proxy_on_request_headers(id, s.request.length, 1);
  }

  responseHeaders(id, status) {
    this.effective = id;
    const s = this.streams.get(id);
    s.response = [[':status', status]];
    return this.x.proxy_on_response_headers(id, 1, 1);
  }

  // respond answers every pending callout with body, on the root context.
  respond(body) {
    let n = 0;
    for (const [token] of this.callouts) {
      this.callouts.delete(token);
      this.callHeaders = [[':status', '200']];
      this.callBody = body;
      this.effective = ROOT;
      this.x.proxy_on_http_call_response(ROOT, token, 1, body.length, 0);
      this.callBody = null;
      n++;
    }
    return n;
  }

  end(id) {
    this.effective = id;
    if (this.x.proxy_on_done) this.x.proxy_on_done(id); // Envoy skips callbacks a module does not export
    this.x.proxy_on_delete(id);
    this.streams.delete(id);
  }

  metric(name) {
    const id = this.metricIds.get(name);
    return id === undefined ? 0 : Number(this.metrics[id].value);
  }
}

const module = new WebAssembly.Module(readFileSync(spec.module));

// serialise writes a header map as the ABI does: a count, a length pair
// per entry, then each name and value with a NUL after it (Latin-1: a
// character is a byte, as str reads them).
function serialise(pairs) {
  let size = 4 + 8 * pairs.length;
  for (const [k, v] of pairs) size += k.length + v.length + 2;
  const bytes = new Uint8Array(size), view = new DataView(bytes.buffer);
  view.setUint32(0, pairs.length, true);
  let at = 4 + 8 * pairs.length;
  pairs.forEach(([k, v], i) => {
    view.setUint32(4 + 8 * i, k.length, true);
    view.setUint32(8 + 8 * i, v.length, true);
    for (const s of [k, v]) {
      for (let j = 0; j < s.length; j++) bytes[at++] = s.charCodeAt(j);
      bytes[at++] = 0;
    }
  });
  return bytes;
}

// The request every scenario sends, serialised once (as a proxy keeps its
// header map in native code); its properties by the path the guest asks
// for (segments joined by NUL).
function template(pairs, props) {
  const byPath = new Map(Object.entries(props).map(([k, v]) => [k.replaceAll('.', '\0'), enc.encode(v)]));
  return { pairs, bytes: serialise(pairs), props: byPath };
}
const request = template(spec.request, spec.props);
const refill = enc.encode(spec.refill_body);
const decision = enc.encode(spec.decision_body);
const out = {};

// The lease hit, as filtertest's BenchmarkRequestLeaseHit runs it: every
// request spends a token of the lease; the one that finds it spent pauses
// and is answered with a refill.
{
  const vm = new VM(module, spec.lease_config);
  let id = 1, refills = 0, paused = 0;
  const one = () => {
    id++;
    vm.open(id, request);
    if (vm.requestHeaders(id) !== CONTINUE) {
      paused++;
      refills += vm.respond(refill);
    }
    vm.responseHeaders(id, '200');
    if (id === 3) out.lease_hit_first = { upstream: vm.streams.get(id).request, response: vm.streams.get(id).response };
    vm.end(id);
  };
  for (let i = 0; i < spec.warmup; i++) one();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < spec.requests; i++) one();
  out.lease_hit_ns = Number(process.hrtime.bigint() - t0) / spec.requests;
  out.lease_hit_refills = refills;
  out.lease_hit_paused = paused;
  out.lease_hit_metric_hits = vm.metric('tollgate_lease_hits_total');
  out.lease_hit_logs = vm.logs;
}

// The callout, as BenchmarkRequestCallout: every request pauses, is
// answered with an admission, and resumes.
{
  const vm = new VM(module, spec.callout_config);
  let id = 1, resumed = 0, callouts = 0;
  const one = () => {
    id++;
    vm.open(id, request);
    if (vm.requestHeaders(id) === CONTINUE) fail('a request with leases off continued without a callout');
    callouts += vm.respond(decision);
    if (vm.streams.get(id).resumed) resumed++;
    vm.responseHeaders(id, '200');
    vm.end(id);
  };
  for (let i = 0; i < spec.warmup; i++) one();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < spec.requests; i++) one();
  out.callout_ns = Number(process.hrtime.bigint() - t0) / spec.requests;
  out.callout_calls = callouts;
  out.callout_resumed = resumed;
  out.callout_logs = vm.logs;
}

process.stdout.write(JSON.stringify(out) + '\n');
