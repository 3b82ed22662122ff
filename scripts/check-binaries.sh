#!/usr/bin/env bash
# `make lint`: no committed binary (ELF or Wasm) and no file over 1 MB. Build
# output belongs in bin/ and build/, which git ignores.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  magic=$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')
  if [ "$magic" = 7f454c46 ] || [ "$magic" = 0061736d ] || [ "$(stat -c %s "$f")" -gt 1000000 ]; then
    bad+=("$f")
  fi
done < <(git ls-files -z)
if [ ${#bad[@]} -gt 0 ]; then
  echo "committed binaries or files over 1 MB (build output belongs in bin/ or build/):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
