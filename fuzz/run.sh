#!/usr/bin/env bash
# Runs every fuzz target (or the ones named as arguments) for CARMINE_FUZZ_SECS seconds each
# (default 20) and fails if any finds a crash, a leak, an allocation over the limit or a hang.
#
#   fuzz/run.sh                                                     # every target, 20 s each
#   CARMINE_FUZZ_SECS=3600 fuzz/run.sh superblock journal_record     # long mode
#   CARMINE_FUZZ_BUDGET_SECS=360 fuzz/run.sh                        # CI: whole script ≤ ~6 min
#
# With CARMINE_FUZZ_BUDGET_SECS, the time left after installing and building is shared among
# the targets still to run (never more than CARMINE_FUZZ_SECS, never less than
# CARMINE_FUZZ_SECS_MIN, default 5), so a slow build shortens the runs instead of the budget.
#
# Each target starts from its committed seeds (fuzz/corpus/<target>, read only) and keeps what
# it finds in fuzz/target/corpus/<target>, so later runs continue from there. A crashing input
# is saved under fuzz/artifacts/<target>/; replay it with `cargo +nightly fuzz run <target>
# <file>`. Needs the nightly toolchain; installs cargo-fuzz if it is missing.
set -euo pipefail
cd "$(dirname "$0")"
fuzz_dir=$(pwd)
SECONDS=0

secs=${CARMINE_FUZZ_SECS:-20}
secs_min=${CARMINE_FUZZ_SECS_MIN:-5}
budget=${CARMINE_FUZZ_BUDGET_SECS:-}
# The contract every target asserts: no panic, no allocation beyond these limits, no input
# taking longer than the timeout.
limits=(-rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -print_final_stats=1)

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: the nightly Rust toolchain is required (cargo-fuzz builds with" \
    "sanitizers): rustup toolchain install nightly" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

# One build for all targets (release, debug assertions, AddressSanitizer).
cargo +nightly fuzz build
echo "fuzz/run.sh: ready after ${SECONDS}s; running ${#targets[@]} targets"

logs="$fuzz_dir/target/fuzz-logs"
mkdir -p "$logs"
failed=()
left=${#targets[@]}
for t in "${targets[@]}"; do
  run_secs=$secs
  if [ -n "$budget" ]; then
    share=$(((budget - SECONDS) / left))
    if [ "$share" -lt "$run_secs" ]; then run_secs=$share; fi
    if [ "$run_secs" -lt "$secs_min" ]; then run_secs=$secs_min; fi
  fi
  left=$((left - 1))
  work="$fuzz_dir/target/corpus/$t"
  mkdir -p "$work" "$fuzz_dir/corpus/$t"
  status=ok
  if ! cargo +nightly fuzz run "$t" "$work" "$fuzz_dir/corpus/$t" -- \
    -max_total_time="$run_secs" "${limits[@]}" >"$logs/$t.log" 2>&1; then
    status=FAILED
    failed+=("$t")
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)
  printf '%-18s %-6s %12s executions in %ss\n' "$t" "$status" "${execs:-?}" "$run_secs"
  if [ "$status" != ok ]; then
    echo "---- $t: last lines of $logs/$t.log" >&2
    tail -40 "$logs/$t.log" >&2
  fi
done
echo "fuzz/run.sh: done in ${SECONDS}s"

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz/run.sh: failing targets: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
