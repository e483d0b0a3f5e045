#!/usr/bin/env python3
"""Run a command (llama-bench --progress), and stamp each stderr line with the UTC time, the
load average and the child's process CPU time so far (utime + stime from /proc/PID/stat, all
threads, clock ticks). At exit print the child's total CPU time (wait4 rusage).

This splits llama-bench's untimed depth fill from its timed generation: the CPU time between
the 'depth run' and 'generation run' progress lines is the fill, the rest up to exit the decode.

usage: phasetime.py LOGFILE -- COMMAND...
"""
import os, subprocess, sys, time

log = open(sys.argv[1], "a", buffering=1)
cmd = sys.argv[sys.argv.index("--") + 1:]
tick = os.sysconf("SC_CLK_TCK")


def stamp(pid, msg):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        cpu = (int(f[11]) + int(f[12])) / tick
    except OSError:
        cpu = float("nan")
    load = open("/proc/loadavg").read().split()[:3]
    log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} load {' '.join(load)} "
              f"cpu {cpu:.2f}] {msg}\n")


log.write(f"# {' '.join(cmd)}\n")
p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
stamp(p.pid, "started")
for line in p.stderr:
    stamp(p.pid, line.rstrip())
_, status, ru = os.wait4(p.pid, 0)
p.returncode = os.waitstatus_to_exitcode(status)
load = open("/proc/loadavg").read().split()[:3]
log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} load {' '.join(load)}] exit "
          f"{p.returncode}: user {ru.ru_utime:.2f} s, sys {ru.ru_stime:.2f} s, "
          f"total cpu {ru.ru_utime + ru.ru_stime:.2f} s, max rss {ru.ru_maxrss / 1024:.0f} MiB\n")
sys.exit(p.returncode)
