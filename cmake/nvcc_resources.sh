#!/bin/sh
# nvcc_resources.sh COMPILER ARGS... — the CUDA compiler launcher of
# MT_CUDA_RESOURCE_LOG=ON (cmake/cuda.cmake): runs the compile as given and
# keeps ptxas's per-kernel resource lines (--resource-usage: registers,
# spill bytes, static shared memory) in OBJECT.res beside the object, one
# file per object, so parallel compiles cannot interleave them. Every other
# line (warnings, errors) still goes to stderr. tests/cuda/resources.py
# reads the .res files (docs/cuda.md, "Launch resources").
out=
prev=
for a in "$@"; do
    [ "$prev" = "-o" ] && out=$a
    prev=$a
done
if [ -z "$out" ]; then exec "$@"; fi
"$@" 2>"$out.res.tmp"
rc=$?
grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' "$out.res.tmp" >&2
mv -f "$out.res.tmp" "$out.res"
exit $rc
