#!/usr/bin/env bash
# The GPU check (issue 26): on a machine with an NVIDIA GPU, from anywhere in the repository:
#
#     bash tools/gpu_check.sh
#
# 1. grades the solutions (every exercise must score full marks, CUDA rows included) and the
#    stubs (0) with --device cuda, and the solutions with --device cpu, each twice (a fresh
#    reference cache, then the warm one), and prints the CPU and CUDA timings side by side;
# 2. grades a batch with a GPU hog beside three honest students (`tools/gpu_hog_check.py`);
# 3. runs every test that needs a real GPU (`pytest -m cuda`; elsewhere they are skipped).
# Exit status 0 when all of it passed, 1 when something failed, 2 when there is no GPU.
# On the course's GPU machine (no nbformat, no bubblewrap in its image) run `source
# .gpu/prelude.sh` first (see /work/shared/gpu/stage.sh); the script sources it itself when
# bwrap is missing and .gpu/prelude.sh is there.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v bwrap >/dev/null 2>&1 && [ -f .gpu/prelude.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/prelude.sh
fi
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing to check"
  exit 2
fi
"$PY" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
CACHE=$(mktemp -d /tmp/gpu-check-cache.XXXXXX)
LOGS=$(mktemp -d /tmp/gpu-check-logs.XXXXXX)
trap 'rm -rf "$CACHE"' EXIT
failed=0
declare -A SECONDS_OF TOTAL_OF

grade() {  # grade WHAT DEVICE STATE: wall seconds and the Total line
  local what=$1 device=$2 state=$3 log="$LOGS/$1-$2-$3.txt" t0 t1
  # a reference cache per device: the cold run starts it empty, the warm one reuses it
  [ "$state" = cold ] && rm -rf "${CACHE:?}/$device"
  t0=$(date +%s.%N)
  AUTOGRADER_CACHE_DIR="$CACHE/$device" "$PY" -m autograder grade "$what" --device "$device" >"$log" 2>&1
  local rc=$?
  t1=$(date +%s.%N)
  SECONDS_OF[$what-$device-$state]=$("$PY" -c "print(f'{$t1 - $t0:.1f}')")
  TOTAL_OF[$what-$device-$state]=$(grep -o 'Total: [0-9.]* / [0-9.]*' "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    echo "gpu_check: grade $what --device $device exited $rc (log: $log)"; tail -20 "$log"; failed=1
  fi
}

for state in cold warm; do
  grade solutions cpu $state
  grade solutions cuda $state
done
grade exercises cuda warm

for key in solutions-cpu-warm solutions-cuda-cold solutions-cuda-warm; do
  case "${TOTAL_OF[$key]}" in
    "Total: 159 / 159") ;;
    *) echo "gpu_check: $key: expected Total: 159 / 159, got '${TOTAL_OF[$key]}' (log: $LOGS/$key.txt)"
       grep -E '✗|~' "$LOGS/$key.txt" | head -30; failed=1 ;;
  esac
done
grep -q "cuda" "$LOGS/solutions-cuda-warm.txt" || { echo "gpu_check: no CUDA rows in the report"; failed=1; }
case "${TOTAL_OF[exercises-cuda-warm]}" in
  "Total: 0 / "*) ;;
  *) echo "gpu_check: stubs: expected Total: 0 / ..., got '${TOTAL_OF[exercises-cuda-warm]}'"; failed=1 ;;
esac

printf '\n%-34s %10s %10s %8s\n' "grade solutions (wall s)" "--device cpu" "cuda" "cuda/cpu"
for state in cold warm; do
  c=${SECONDS_OF[solutions-cpu-$state]} g=${SECONDS_OF[solutions-cuda-$state]}
  printf '%-34s %10s %10s %8s\n' "$state reference cache" "$c" "$g" "$("$PY" -c "print(f'{$g / $c:.2f}x')")"
done
printf '%-34s %10s %10s\n' "stubs (grade exercises), warm" "-" "${SECONDS_OF[exercises-cuda-warm]}"
printf '%-34s %10s %10s\n' "scores" "${TOTAL_OF[solutions-cpu-warm]#Total: }" "${TOTAL_OF[solutions-cuda-warm]#Total: }"

# One student must not take the GPU from the others (issue 26's hog, on the real GPU).
echo
"$PY" tools/gpu_hog_check.py || failed=1

# Only the files that hold CUDA tests (the others may need what a GPU image lacks, e.g. playwright).
mapfile -t files < <(grep -l "pytest.mark.cuda" tests/*/test_*.py)
echo
echo "gpu_check: pytest -m cuda ${files[*]}"
"$PY" -m pytest -q -m cuda -p no:cacheprovider "${files[@]}" || failed=1

echo
if [ $failed -eq 0 ]; then echo "gpu_check: PASSED"; else echo "gpu_check: FAILED (logs in $LOGS)"; fi
exit $failed
