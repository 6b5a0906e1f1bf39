#!/usr/bin/env bash
# The H200 session of issues 11 and 15 as calls (each under the device tool's 10 minutes; the machine
# stays warm 30 s between calls: a later call on a cold one rebuilds, or takes prepare.py --prebuilt).
# Everything lands in $WORK (/tmp/clover-dev) and a later call reuses it; what comes back is
# $OUT/result.json, $OUT/run.log and $OUT/all.tgz (the rest: ops logs, stderr, notes), since the
# tool returns at most 8 files.
#
#   bash bench/device/session.sh 1   # build, 8-layer checkpoint + Q4_K_M, baseline and clover timings (4, 8 layers:
#                                    # the ar mode beside upstream's step on its own context, the host split),
#                                    # Nsight kernel times of the engine's AR step and the plain one
#   bash bench/device/session.sh 2   # clover verify parity at full width (4 layers): F32, Q8_0, Q4_K_M on the CPU
#                                    # (extra buffer types on and off) and the GPU; run again to resume it
#   bash bench/device/session.sh 3   # 4 layers: timings, the kernel profile of the AR step with and without the
#                                    # loop's adjustment entries, parity at full width, tiny and small
set -u
call=${1:?which call: 1, 2 or 3}
export QUANTS=q4_k_m
case $call in
  1) STAGES=build,gen,convert,baseline,clover,profile LAYERS="4 8" PROFILE_PASSES="raw-ar ar" BUDGET_S=560 \
     bash bench/device/run.sh ;;
  2) STAGES=build,gen,parity LAYERS=4 PARITY_PRESETS=full-width BUDGET_S=570 bash bench/device/run.sh ;;
  3) STAGES=build,gen,convert,baseline,clover,profile,parity LAYERS=4 PROFILE_PASSES="raw-ar ar ar-adj" \
     PARITY_PRESETS=full-width,tiny,small BUDGET_S=570 bash bench/device/run.sh ;;
  *) echo "call 1, 2 or 3" >&2; exit 2 ;;
esac
rc=$?
OUT=${OUT:-/tmp/clover-out}
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=result.json --exclude=run.log . 2>/dev/null \
    && find . -mindepth 1 ! -name all.tgz ! -name result.json ! -name run.log -delete )
exit $rc
