# Static resource check of every CUDA kernel (make test, no device needed):
# reads ptxas's report (nvcc --resource-usage) that the build wrote beside
# each kernels/cuda/**/*.cu object of kvserve_cuda (cmake/nvcc_resources.sh, the
# target's compiler launcher, so nothing is compiled again), tabulates
# registers, spills, stack and static shared memory per kernel, and fails when
#   - an attention, KV-write or sampling kernel spills (spill stores or
#     loads > 0: local-memory traffic in the hot loops) more than the known
#     spills below allow (open findings of issue 23, to be removed when
#     fixed: a new spill, or a larger one, fails), or
#   - a kernel's static shared memory is over 48 KiB (the most a launch
#     gets without the dynamic opt-in), or
#   - a kernels/cuda/**/*.cu has no report (the build did not compile it so).
# Usage: resource_check.sh SOURCE_DIR BUILD_DIR [TABLE.md]
# With TABLE.md, writes the table there (docs/cuda-resources.md is made so).
set -euo pipefail
src="${1:?usage: resource_check.sh SOURCE_DIR BUILD_DIR [TABLE.md]}"
build="${2:?usage: resource_check.sh SOURCE_DIR BUILD_DIR [TABLE.md]}"
table="${3:-}"
objdir="$build/CMakeFiles/kvserve_cuda.dir/kernels/cuda"
[[ -d "$objdir" ]] || { echo "resource_check: no kvserve_cuda objects in $build (CUDA off?)"; exit 77; }
work="$build/resource-check"
rm -rf "$work"
mkdir -p "$work"
while IFS= read -r -d '' cu; do
  rel="${cu#"$src"/kernels/cuda/}"
  name="$(basename "$cu" .cu)"
  report="$objdir/$rel.o.resources"
  if [[ ! -f "$report" || "$report" -ot "$cu" ]]; then
    echo "resource_check: FAIL: no ptxas report for kernels/cuda/$rel at $report" \
         "(build kvserve_cuda, whose launcher writes it)"
    exit 1
  fi
  cp "$report" "$work/$name.log"
done < <(find "$src/kernels/cuda" -name '*.cu' -print0 | sort -z)

/usr/bin/python3 - "$work" "$table" <<'PY'
import glob, os, re, subprocess, sys
work, table = sys.argv[1], sys.argv[2]
rows = []
for log in sorted(glob.glob(os.path.join(work, "*.log"))):
    unit = os.path.basename(log)[:-4]
    fn = None
    for line in open(log):
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            fn = {"unit": unit, "mangled": m.group(1), "stack": 0, "spill_st": 0, "spill_ld": 0,
                  "regs": 0, "smem": 0}
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and fn is not None:
            fn["stack"], fn["spill_st"], fn["spill_ld"] = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and fn is not None:
            fn["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            fn["smem"] = int(s.group(1)) if s else 0
            rows.append(fn)
            fn = None
names = subprocess.run(["c++filt"], input="\n".join(r["mangled"] for r in rows), text=True,
                       capture_output=True).stdout.splitlines() if rows else []
for r, n in zip(rows, names):
    n = re.sub(r"\([^()]*\)$", "", n)  # the parameter list
    r["name"] = n.replace("kvserve::cuda::", "").replace("kvserve::", "").replace("void ", "", 1)
hot = ("attention_detail", "kv_write_detail", "kv_kc_detail", "attention_kc_detail", "sample_detail")
# Known spills (bytes of spill loads allowed), measured with nvcc 13.0 for
# sm_90a: open findings, not accepted costs.
#   MassKernel<bf16>, <int8> (the attention-mass pass of KV eviction): 8 and
#     16 bytes; SampleKernel (the device sampler): 28 B stored, 52 B loaded.
known = {"attention_detail::MassKernel": 16, "sample_detail::SampleKernel": 52}
failures = []
for r in rows:
    if any(h in r["name"] for h in hot) and (r["spill_st"] or r["spill_ld"]):
        allowed = next((v for k, v in known.items() if r["name"].startswith(k)), 0)
        if max(r["spill_st"], r["spill_ld"]) > allowed:
            failures.append(f"{r['name']} spills ({r['spill_st']} B stored, {r['spill_ld']} B "
                            f"loaded; known: {allowed})")
    if r["smem"] > 48 * 1024:
        failures.append(f"{r['name']} has {r['smem']} B of static shared memory (> 48 KiB)")
lines = ["| unit | kernel | registers | spill stores / loads (B) | stack (B) | static smem (B) |",
         "|---|---|---:|---:|---:|---:|"]
for r in sorted(rows, key=lambda r: (r["unit"], r["name"])):
    lines.append(f"| {r['unit']} | `{r['name']}` | {r['regs']} | {r['spill_st']} / {r['spill_ld']} "
                 f"| {r['stack']} | {r['smem']} |")
print("\n".join(lines))
print(f"resource_check: {len(rows)} kernels")
if table:
    with open(table) as f:
        doc = f.read()
    begin, end = "<!-- resource table begin -->", "<!-- resource table end -->"
    if begin in doc and end in doc:
        doc = doc[:doc.index(begin) + len(begin)] + "\n" + "\n".join(lines) + "\n" + doc[doc.index(end):]
        with open(table, "w") as f:
            f.write(doc)
if not rows:
    print("resource_check: FAIL: no kernel in ptxas's output")
    sys.exit(1)
if failures:
    print("resource_check: FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("resource_check: PASS")
PY
