cd /work/main
for r in 1 2; do
  for b in old new; do
    CARMINE=/tmp/rul/carmine-$b STORE=native bash /tmp/rul/rul.sh /tmp/rul/bab-$r-$b 128 1G > /tmp/rul/bab-$r-$b.log 2>&1
    echo "r$r $b: $(grep -E 'refilled' /tmp/rul/bab-$r-$b.log | sed 's/.*refilled/refilled/')"; grep -A1 "IOPS per" /tmp/rul/bab-$r-$b.log | tail -1
  done
done
