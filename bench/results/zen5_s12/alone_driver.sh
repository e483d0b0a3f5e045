#!/bin/bash
while ! grep -q 'llama done' /tmp/s12/depth-avx512/log; do sleep 5; done
PIDS=$(pgrep -f 'cmake --build /work/build/asan'; pgrep -f 'clang' ; pgrep -f 'make.*asan')
echo "stopping $PIDS" > /tmp/s12/alone_driver.log
for p in $PIDS; do kill -STOP $p 2>/dev/null; done
pkill -STOP -f clang; pkill -STOP -f 'gmake\|/usr/bin/make'
sleep 2
CORE=1 /tmp/s12/depth-avx512/run_kvslim_alone.sh &
A=$!
CORE=0 /tmp/s12/depth-avx2/run_kvslim_alone.sh &
B=$!
wait $A $B
pkill -CONT -f clang; pkill -CONT -f 'gmake\|/usr/bin/make'
for p in $PIDS; do kill -CONT $p 2>/dev/null; done
echo "resumed $(date)" >> /tmp/s12/alone_driver.log
