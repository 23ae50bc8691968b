#!/usr/bin/env bash
# Static cost of the fast paged attention kernel's main loop, from its PTX
# (make test runs it as the ctest entry attention_cost_check; no GPU needed).
#
# nvcc compiles kernels/cuda/attention/paged_attention.cu to PTX for sm_90a with
# KVSERVE_COST_MARKERS, which brackets the body of the kernel's tile loop
# and its rare sink branch with PTX comments. For the bf16, int8 and int4
# kernels at head_dim 128 the script counts the PTX instructions of one
# pass of the body (the sink branch left out; everything else is unrolled at
# head_dim 128, so this is what each warp issues per 64-key tile) and prints
#   instructions per key per CTA = body * 4 warps / 64 keys
# and per byte of K/V read (bf16 512 B a key, int8 264, int4 136 with
# group 64's scales), in the steady state (no row's running max moves, so
# the rescale branch is skipped) and with the rescale. It fails when bf16
# exceeds the issue's goal (40) or a format regresses past its bound below. PTX is not SASS: ptxas
# schedules, folds address arithmetic and drops moves, so the device's
# figures differ by a few instructions a key; a device run measures time.
#
# Usage: attention_cost_check.sh SOURCE_DIR [NVCC]
set -euo pipefail
src=${1:?usage: attention_cost_check.sh SOURCE_DIR [NVCC]}
nvcc=${2:-/usr/local/cuda/bin/nvcc}
if [[ ! -x "$nvcc" ]]; then
  echo "attention_cost_check: no nvcc at $nvcc: skipped" >&2
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$nvcc" -ptx -O3 -DNDEBUG -DKVSERVE_HAVE_CUDA=1 -DKVSERVE_COST_MARKERS=1 -std=c++17 \
  --expt-relaxed-constexpr -arch=sm_90a -I"$src" -isystem "$(dirname "$nvcc")/../include" \
  "$src/kernels/cuda/attention/paged_attention.cu" -o "$work/attention.ptx"
/usr/bin/python3 - "$work/attention.ptx" <<'EOF'
import re, sys

ptx = open(sys.argv[1]).read()
# KvElem values (cache/format/kv_layout.h): kBf16 2, kInt8 4, kInt4 5.
kernels = {
    "bf16": ("_ZN7kvserve4cuda16attention_detail18MmaAttentionKernelILNS_6KvElemE2ELS3_2ELi128EEEvNS1_10KernelArgsE", 512),
    "int8": ("_ZN7kvserve4cuda16attention_detail18MmaAttentionKernelILNS_6KvElemE4ELS3_4ELi128EEEvNS1_10KernelArgsE", 264),
    "int4": ("_ZN7kvserve4cuda16attention_detail18MmaAttentionKernelILNS_6KvElemE5ELS3_5ELi128EEEvNS1_10KernelArgsE", 136),
}
# Upper bounds per key per CTA (steady state): bf16 the issue's goal (40;
# 39.7 measured when the check was added); int8 and int4 what they measured
# then (88.8, 99.8: the pass that decodes the stage into fp16 tiles
# dominates; 83.1 and 102.2 once their 14 and 30 integer divisions became
# shifts, which the PTX count showed as one instruction each; 74.7 and 93.9
# with K decoded in registers instead of into an fp16 tile) plus 10%, so a
# regression fails; their goal, fewer
# instructions per byte than bf16, is reported, not yet met.
bounds = {"bf16": 40.0, "int8": 98.0, "int4": 110.0}

def body(name):
    """(steady-state count, count with the rescale branch) of the tile loop."""
    start = ptx.find(".entry " + name)
    if start < 0:
        sys.exit(f"attention_cost_check: {name} not in the PTX")
    # The function ends where the next one's .globl comment starts (a lone
    # "}" line also closes inline asm blocks).
    end = ptx.find("// .globl", start)
    text = ptx[start:end if end > 0 else len(ptx)]
    b = text.find("// KV_COST tile_begin;")
    e = text.find("// KV_COST tile_end;")
    if b < 0 or e < b:
        sys.exit(f"attention_cost_check: the tile loop markers of {name} are missing")
    steady, rescale, divisions, region = 0, 0, 0, None
    for line in text[b:e].splitlines():
        t = line.strip()
        m = re.match(r"// KV_COST (\w+)_(begin|end);", t)
        if m and m.group(1) in ("sinks", "rescale"):
            region = m.group(1) if m.group(2) == "begin" else None
            continue
        if not t or t.startswith("//") or t.startswith(".") or t.endswith(":") or t in ("{", "}"):
            continue
        if not (t.startswith("@") or re.match(r"^[a-z]", t)):
            continue
        if re.match(r"^(@!?%p\d+\s+)?(div|rem)\.[su]", t):
            divisions += 1
        if region is None:
            steady += 1
        elif region == "rescale":
            rescale += 1
    return steady, steady + rescale, divisions

failed = False
rows = []
for fmt, (name, nbytes) in kernels.items():
    steady, full, divisions = body(name)
    # One PTX instruction, some 20 in SASS (no hardware integer divide):
    # the loop addresses by shifts and masks (power-of-two block and group
    # sizes), so any division is a regression the count would hide.
    if divisions:
        print(f"attention_cost_check: {fmt}: {divisions} integer divisions in the tile loop")
        failed = True
    per_key, per_key_full = steady * 4 / 64, full * 4 / 64
    rows.append((fmt, steady, per_key, per_key_full, per_key / nbytes))
    if per_key > bounds[fmt]:
        failed = True
print("attention_cost_check: fast kernel main loop, head_dim 128, 64-key tiles, 4 warps (PTX)")
print("  steady: a tile where no row's running max moves (the rescale branch skipped)")
print(f"{'format':<8}{'body':>8}{'per key':>10}{'+rescale':>10}{'per KB':>10}{'bound':>8}")
for fmt, n, pk, pkf, pb in rows:
    print(f"{fmt:<8}{n:>8}{pk:>10.1f}{pkf:>10.1f}{pb * 1024:>10.1f}{bounds[fmt]:>8.1f}")
bf16_pb = rows[0][4]
for fmt, n, pk, pkf, pb in rows[1:]:
    verdict = "met" if pb < bf16_pb else "not met"
    print(f"goal: {fmt} fewer instructions per byte than bf16: {verdict}")
if failed:
    sys.exit("attention_cost_check: a format is past its bound or divides in its tile loop")
EOF
