cd /work/main
for r in 1 2; do
  for mode in default purge1s; do
    if [ $mode = purge1s ]; then export MIMALLOC_PURGE_DELAY=1000; else unset MIMALLOC_PURGE_DELAY; fi
    STORE=native bash /tmp/rul/rul.sh /tmp/rul/pab-$r-$mode 128 1G > /tmp/rul/pab-$r-$mode.log 2>&1
    echo "r$r $mode: $(grep -E 'refilled' /tmp/rul/pab-$r-$mode.log)"; grep -A1 "IOPS per" /tmp/rul/pab-$r-$mode.log | tail -1
  done
done
