"""Scarab's memory between bursts of work: one service, BURSTS bursts of N one-step
/bin/true runs from 2 clients (the side-by-side's load), and after each burst, once the
supervisors the zygote kept have ended, the RSS of the service alone and with its zygote
and kept supervisors (peer.scarab_mb), that sum in PSS (the binary's pages they share
counted once), beside the store file's size. Memory that stays
after work is what a service holds between bursts: the store's page cache fills with the
pages the driver writes (limits::STORE_CACHE_BYTES), and the allocator keeps its heap.

Usage: python3 benches/peer/memory.py [N] [BURSTS] [SCARAB_BINARY]
(defaults 4000, 5, target/release/scarab); the state goes under $PEER_SCRATCH as the
side-by-side's does. Results: docs/benchmarks.md, "Memory after use".
"""

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    bursts = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    exe = os.path.abspath(sys.argv[3] if len(sys.argv) > 3 else "target/release/scarab")
    scratch = tempfile.mkdtemp(prefix="memory-", dir=peer.scratch_root()[0])
    service = peer.Service(exe, scratch)
    try:
        def report(label, runs):
            time.sleep(peer.SUPERVISOR_KEPT_FOR)
            store = os.path.getsize(os.path.join(service.state, "scarab.redb")) / 1e6
            print(f"| {label} | {runs} | {service.rss_mb():.1f} MB | "
                  f"{service.rss_with_zygote_mb():.1f} MB | {service.pss_with_zygote_mb():.1f} MB | "
                  f"{store:.1f} MB |", flush=True)

        print(f"{exe}: {bursts} bursts of {n} one-step runs from {peer.CLIENTS} clients")
        print("| idle after | runs so far | service RSS | with zygote and kept supervisors | the same in PSS | store file |")
        print("|---|---|---|---|---|---|")
        service.submit(1)
        service.wait_finished(1)
        report("one run", 1)
        for burst in range(1, bursts + 1):
            peer.in_threads(lambda _, count: service.submit(count), n)
            total = 1 + burst * n
            service.wait_finished(total)
            report(f"burst {burst}", total)
    finally:
        service.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
