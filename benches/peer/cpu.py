"""CPU per run of Scarab alone under the side-by-side's load: N one-step /bin/true runs
from 2 clients (peer.py's Scarab leg), with the machine's busy time from /proc/stat
(user + nice + system + irq + softirq, all processes: the service, its zygote and
supervisors, the steps and the Python clients) divided by N, and the driver's commits
per run and mean commit (its metrics before and after).

Usage: python3 benches/peer/cpu.py N [SCARAB_BINARY ...]; with several binaries they take
turns, which is how docs/benchmarks.md compares two builds on this noisy machine.
PEER_CHURN=K first creates K directories with a file in each and removes them, before
every round: on ext4 without a journal that makes the round's inode creates dear (see
peer.create_cost_us), the other regime to compare builds in.
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402


def busy_ticks():
    fields = list(map(int, open("/proc/stat").readline().split()[1:8]))
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return user + nice + system + irq + softirq


def churn(root, k):
    """K directories with an empty file in each, created and removed."""
    if k <= 0:
        return
    made = tempfile.mkdtemp(prefix="churn-", dir=root)
    for i in range(k):
        entry = os.path.join(made, str(i))
        os.mkdir(entry)
        open(os.path.join(entry, "f"), "w").close()
    shutil.rmtree(made)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    churned = int(os.environ.get("PEER_CHURN", "0"))
    binaries = sys.argv[2:] or ["target/release/scarab"]
    scratch = tempfile.mkdtemp(prefix="cpu-", dir=peer.scratch_root()[0])
    hz = os.sysconf("SC_CLK_TCK")
    # No wait for an idle RSS: it is not measured here, and the wait's own noise would be.
    peer.SUPERVISOR_KEPT_FOR = 0
    try:
        for exe in binaries:
            # Outside the CPU counted: it is the filesystem's state, not Scarab's work.
            churn(scratch, churned)
            creates = peer.create_cost_us(scratch)
            before = busy_ticks()
            result = peer.scarab(n, os.path.abspath(exe), scratch, creates)
            ms = (busy_ticks() - before) / hz * 1000 / n
            print(f"{exe}: {result['rate']:.0f} runs/s, {ms:.2f} ms CPU per run, "
                  f"{result['commits_per_run']:.2f} commits per run x {result['commit_ms']:.3f} ms "
                  f"(driver {result['driver_busy'] * 100:.0f}% busy; an inode created there "
                  f"cost {creates:.0f} us just before)", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
