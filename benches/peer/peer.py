"""Scarab beside durable Celery: the same N one-step jobs (spawn /bin/true), 2 clients.

Started by benches/peer/run.sh, which installs Redis and Celery. Every server runs on
loopback in a scratch directory and is stopped at the end. Prints one table row per
system and the ratio, plus each one's resident memory.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

CLIENTS = 2

TASKS = '''
import subprocess
from celery import Celery
app = Celery("peer", broker="{url}", backend="{url}")
app.conf.update(
    task_acks_late=True,               # a task is acked only after it ran (durable)
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    result_expires=3600,
    broker_connection_retry_on_startup=True,
)

@app.task
def true():
    subprocess.run(["/bin/true"], check=True)
    return 0
'''

PIPELINE = b"name: peer\nsteps:\n  - name: t\n    run: [/bin/true]\n"


def scratch_root():
    """Where the state of every system goes: $PEER_SCRATCH, else /var/tmp, which Debian
    keeps on disk as it keeps /var/lib (where Scarab's package puts its state). Never a
    tmpfs, where an fsync costs nothing. Not target/, where builds and tests delete files
    all the time: see create_cost_us."""
    root = os.environ.get("PEER_SCRATCH", "/var/tmp")
    fs = filesystem_of(root)
    if fs == "tmpfs":
        raise SystemExit(f"{root} is a tmpfs, where fsync is free: set PEER_SCRATCH to a disk")
    return root, fs


def create_cost_us(root, n=200):
    """What creating an inode costs in `root` now: the median of n times one directory
    and one empty file in it (what each attempt of Scarab makes a few of), per inode, in
    microseconds. On ext4 without a journal (the root filesystem of the machine of
    docs/benchmarks.md) every create skips each free inode of its block group that was
    deleted in the last 1 to 6 minutes, so this moves tenfold with what was deleted
    lately, Scarab's rounds of a previous run included. Celery creates no file per job.
    The probes stay until the scratch is removed: removing them now would make the
    next creates dearer."""
    probe = tempfile.mkdtemp(prefix="creates-", dir=root)
    samples = []
    for i in range(n):
        start = time.perf_counter()
        entry = os.path.join(probe, str(i))
        os.mkdir(entry)
        with open(os.path.join(entry, "f"), "w"):
            pass
        samples.append(time.perf_counter() - start)
    return sorted(samples)[n // 2] / 2 * 1e6


def fsync_us(root, n=200):
    """What a durable append costs in `root` now: the median of n times one 4 KiB write
    and fdatasync, in microseconds. Durable Celery waits for one of these (Redis's
    append-only log) per acknowledgement; Scarab for a redb commit, which writes many
    pages and syncs once. The file stays until the scratch is removed, like
    create_cost_us's probes."""
    fd, _ = tempfile.mkstemp(prefix="fsync-", dir=root)
    block = b"x" * 4096
    samples = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            os.pwrite(fd, block, 0)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - start)
    finally:
        os.close(fd)
    return sorted(samples)[n // 2] * 1e6


def filesystem_of(path):
    """The type of the filesystem `path` is on (the longest mount point above it)."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1]
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_kb_field_mb(path, field):
    """A `Field:  N kB` line of a /proc file, in MB; 0 when the process is gone."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def rss_mb(pid):
    return proc_kb_field_mb(f"/proc/{pid}/status", "VmRSS:")


def pss_mb(pid):
    """A process's proportional set size: each page it shares counted as its share, so
    that a sum over the processes sharing it counts it once."""
    return proc_kb_field_mb(f"/proc/{pid}/smaps_rollup", "Pss:")


def scarab_mb(pid, measure=rss_mb):
    """The service's memory plus its supervisor zygote's and the supervisors it keeps
    (processes of Scarab's too, sharing the binary's pages with the service, so a sum of
    RSS counts those more than once; one of PSS, once)."""
    total = measure(pid)
    children = []
    # Children are listed per thread, and the zygote's parent is whichever thread
    # spawned it.
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            children += open(f"/proc/{pid}/task/{task}/children").read().split()
        except OSError:
            pass
    for child in children:
        try:
            cmdline = open(f"/proc/{child}/cmdline", "rb").read()
        except OSError:
            continue
        if cmdline.endswith(b"supervise\0--zygote\0"):
            total += tree_mb(int(child), measure)
    return total


# How long the zygote keeps a free supervisor (limits::SUPERVISOR_KEPT_FOR), and a margin
# for its once-a-second sweep.
SUPERVISOR_KEPT_FOR = 5 + 2
# How often the Scarab leg looks whether its runs have finished (seconds). Each look is a
# GET /metrics on one kept connection: 87 us of the service's CPU and 161 us of this
# process's. Looking every 5 ms on a new connection each time (230 + 298 us) took about
# 4% of two cores in principle; alternating the two waits moved neither the rate nor
# the CPU per run beyond the noise (docs/benchmarks.md), but the lighter one is kept.
POLL_EVERY = float(os.environ.get("PEER_POLL_MS", "20")) / 1000


def tree_mb(pid, measure=rss_mb):
    """The memory of a process and all its descendants: RSS, or what `measure` gives."""
    total = measure(pid)
    try:
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    except OSError:
        children = []
    for child in children:
        total += tree_mb(int(child), measure)
    return total


def wait_port(port, within=30):
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def in_threads(work, n):
    """Runs work(i) for i in range(CLIENTS) concurrently, returns their results."""
    results = [None] * CLIENTS
    errors = []

    def run(i):
        try:
            results[i] = work(i, n // CLIENTS + (1 if i < n % CLIENTS else 0))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def celery(n, fsync_always, scratch):
    port = free_port()
    data = tempfile.mkdtemp(dir=scratch)
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", data, "--save", ""]
    if fsync_always:
        args += ["--appendonly", "yes", "--appendfsync", "always"]
    redis = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    url = f"redis://127.0.0.1:{port}/0"
    app_dir = tempfile.mkdtemp(dir=scratch)
    with open(os.path.join(app_dir, "peer_tasks.py"), "w") as f:
        f.write(TASKS.format(url=url))
    env = dict(os.environ, PYTHONPATH=app_dir)
    worker = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "celery"), "-A", "peer_tasks", "worker",
         "--pool=prefork", "--concurrency=2", "--loglevel=WARNING", "--without-gossip",
         "--without-mingle", "--without-heartbeat"],
        cwd=app_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    sys.path.insert(0, app_dir)
    import importlib
    tasks = importlib.import_module("peer_tasks")
    importlib.reload(tasks)
    sys.path.remove(app_dir)
    try:
        # Warm up: the worker is up and answering.
        tasks.true.delay().get(timeout=60)
        idle = tree_mb(worker.pid) + rss_mb(redis.pid)
        idle_pss = tree_mb(worker.pid, pss_mb) + pss_mb(redis.pid)

        def client(_, count):
            results = [tasks.true.delay() for _ in range(count)]
            submitted = time.perf_counter()
            for r in results:
                r.get(timeout=600)
            return submitted

        start = time.perf_counter()
        submitted = in_threads(client, n)
        elapsed = time.perf_counter() - start
        return {
            "rate": n / elapsed,
            "elapsed": elapsed,
            "submit": max(submitted) - start,
            "rss": idle,
            "pss": idle_pss,
        }
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
        redis.terminate()
        redis.wait()


class Service:
    """A `scarab serve` on a fresh state dir under `scratch`, with its admin token; stop()
    ends it (SIGTERM, then SIGKILL after 30 s)."""

    def __init__(self, exe, scratch):
        self.port = free_port()
        self.state = tempfile.mkdtemp(dir=scratch)
        os.chmod(self.state, 0o700)
        self.process = subprocess.Popen(
            [exe, "serve", "--state-dir", self.state, "--listen", f"127.0.0.1:{self.port}"],
            env=dict(os.environ, SCARAB_LOG="warn"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(self.port)
            token_file = os.path.join(self.state, "admin.token")
            deadline = time.time() + 30
            while not os.path.exists(token_file) and time.time() < deadline:
                time.sleep(0.05)
            with open(token_file) as f:
                token = f.read().strip()
        except BaseException:
            self.stop()
            raise
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"}
        # The connection metrics() keeps between calls.
        self.conn = None

    def stop(self):
        if self.conn is not None:
            self.conn.close()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def metrics(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port)
        try:
            self.conn.request("GET", "/metrics")
            return self.conn.getresponse().read().decode()
        except (http.client.HTTPException, OSError):
            # The service closed the kept connection (one idle for 10 s:
            # limits::HTTP_HEADER_READ_TIMEOUT): once more on a new one.
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port)
            self.conn.request("GET", "/metrics")
            return self.conn.getresponse().read().decode()

    def commits(self):
        """The driver's commits so far and the seconds they took (each from its batch's
        start to the end of its fsync)."""
        text = self.metrics()
        count = re.search(r"^scarab_commit_duration_seconds_count (\S+)", text, re.M)
        total = re.search(r"^scarab_commit_duration_seconds_sum (\S+)", text, re.M)
        return (float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0)

    def finished(self):
        text = self.metrics()
        done = 0
        for state_name in ("succeeded", "failed", "dead_lettered", "cancelled"):
            m = re.search(r'^scarab_runs\{state="%s"\} (\d+)' % state_name, text, re.M)
            if m:
                done += int(m.group(1))
        return done

    def wait_finished(self, total):
        """Returns once `total` runs have ended, looking every POLL_EVERY."""
        while self.finished() < total:
            time.sleep(POLL_EVERY)

    def submit(self, count):
        """Submits `count` runs of PIPELINE one after another on one keep-alive connection;
        returns when the last was acknowledged."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port)
        for _ in range(count):
            conn.request("POST", "/v1/runs", body=PIPELINE, headers=self.headers)
            response = conn.getresponse()
            body = response.read()
            if response.status != 201:
                raise SystemExit(f"submit answered {response.status}: {body[:200]}")
        conn.close()
        return time.perf_counter()

    def rss_mb(self):
        """The service's RSS alone."""
        return rss_mb(self.process.pid)

    def rss_with_zygote_mb(self):
        """The service's RSS with its zygote's and kept supervisors' (scarab_mb)."""
        return scarab_mb(self.process.pid)

    def pss_with_zygote_mb(self):
        """The same sum in PSS: the pages they share counted once."""
        return scarab_mb(self.process.pid, pss_mb)


def scarab(n, exe, scratch, creates=None):
    """Scarab's leg; `creates` is create_cost_us(scratch) if the caller took it already."""
    if creates is None:
        creates = create_cost_us(scratch)
    service = Service(exe, scratch)
    try:
        # Warm up with one run, then wait for it.
        service.submit(1)
        service.wait_finished(1)
        # Right after the run a supervisor is kept for the next; idle is once it ended.
        warm = service.rss_with_zygote_mb()
        time.sleep(SUPERVISOR_KEPT_FOR)
        idle = service.rss_with_zygote_mb()
        idle_pss = service.pss_with_zygote_mb()

        before = service.commits()
        start = time.perf_counter()
        submitted = in_threads(lambda _, count: service.submit(count), n)
        service.wait_finished(n + 1)
        elapsed = time.perf_counter() - start
        after = service.commits()
        count, seconds = after[0] - before[0], after[1] - before[1]
        busy = service.rss_with_zygote_mb()
        # Idle again once the kept supervisors ended: what the runs left behind (the
        # store's page cache, the allocator's heap), the memory a service holds between
        # bursts of work.
        time.sleep(SUPERVISOR_KEPT_FOR)
        return {
            "rate": n / elapsed,
            "elapsed": elapsed,
            "submit": max(submitted) - start,
            "rss": idle,
            "pss": idle_pss,
            "rss_warm": warm,
            "rss_after": busy,
            "rss_idle_after": service.rss_with_zygote_mb(),
            "rss_service_idle_after": service.rss_mb(),
            "pss_idle_after": service.pss_with_zygote_mb(),
            "creates_us": creates,
            # The driver is one serial loop: the share of the time it spent committing
            # says how close it is to being the limit.
            "commits_per_run": count / n,
            "commit_ms": seconds / count * 1000 if count else 0.0,
            "driver_busy": seconds / elapsed,
        }
    finally:
        service.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scarab", required=True)
    args = parser.parse_args()
    root, fs = scratch_root()
    scratch = tempfile.mkdtemp(prefix="peer-", dir=root)
    systems = {
        "scarab": lambda: scarab(args.runs, os.path.abspath(args.scarab), scratch),
        "celery_fsync_always": lambda: celery(args.runs, True, scratch),
        "celery_default": lambda: celery(args.runs, False, scratch),
    }
    # The systems take turns, round after round, so that a burst of load from other
    # tenants of a shared machine falls on all of them; each is reported by its median
    # round.
    rounds = {key: [] for key in systems}
    try:
        for _ in range(args.rounds):
            for key, measure in systems.items():
                fsync = fsync_us(scratch)
                result = measure()
                result["fsync_us"] = fsync
                rounds[key].append(result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = {key: sorted(runs, key=lambda r: r["rate"])[len(runs) // 2] for key, runs in rounds.items()}
    cpus = os.cpu_count()
    print(f"machine: {cpus} cores; {args.runs} one-step /bin/true jobs, {CLIENTS} clients, "
          f"median of {args.rounds} rounds; state of all three in {root} ({fs})")
    # RSS sums count the pages a system's processes share (the binary, a prefork
    # worker's copied-on-write heap) once per process; PSS counts them once.
    print("| system | jobs/s (median) | every round | all done in | submissions done in | idle RSS (sum) | idle PSS (sum) |")
    print("|---|---|---|---|---|---|---|")
    names = {
        "scarab": "Scarab (every transition fsynced)",
        "celery_fsync_always": "Celery 5 + Redis, appendfsync always (prefork, 2)",
        "celery_default": "Celery 5 + Redis, default persistence (prefork, 2)",
    }
    for key, r in results.items():
        every = ", ".join(f"{x['rate']:.0f}" for x in rounds[key])
        print(f"| {names[key]} | {r['rate']:.0f} | {every} | {r['elapsed']:.2f} s | {r['submit']:.2f} s | {r['rss']:.1f} MB | {r['pss']:.1f} MB |")
    r = results["scarab"]
    every = ", ".join(f"{x['creates_us']:.0f}" for x in rounds["scarab"])
    print(f"An inode created in the scratch before each Scarab round: {every} us (median of 200); "
          "Scarab creates 2 per attempt (its directory and attempt.jsonl). Above ~50 us, recently deleted files of this filesystem "
          "are slowing Scarab down (see create_cost_us)")
    short = {"scarab": "Scarab", "celery_fsync_always": "durable Celery", "celery_default": "default Celery"}
    every = "; ".join(
        f"{short[key]}: " + ", ".join(f"{x['fsync_us']:.0f}" for x in runs) for key, runs in rounds.items()
    )
    print(f"A 4 KiB write and fdatasync in the scratch before each round, us (median of 200): {every}; "
          "durable Celery waits for one per acknowledgement (Redis's append-only log), Scarab for a redb commit of many pages")
    print(f"Scarab RSS right after one run (a supervisor kept for the next): {r['rss_warm']:.1f} MB; "
          f"right after the {args.runs} runs: {r['rss_after']:.1f} MB; idle again after them: "
          f"{r['rss_idle_after']:.1f} MB (the service alone {r['rss_service_idle_after']:.1f} MB; "
          f"in PSS {r['pss_idle_after']:.1f} MB)")
    every = ", ".join(
        f"{x['commits_per_run']:.2f} x {x['commit_ms']:.2f} ms = {x['driver_busy'] * 100:.0f}%"
        for x in rounds["scarab"]
    )
    print(f"Scarab's driver, each round: commits per run x mean commit = share of the time spent committing: {every}")
    ratio = results["scarab"]["rate"] / results["celery_fsync_always"]["rate"]
    # Each round's pair ran minutes apart at most: how far single rounds spread says how
    # much of the medians' ratio is this machine's noise.
    paired = ", ".join(
        f"{s['rate'] / c['rate']:.2f}" for s, c in zip(rounds["scarab"], rounds["celery_fsync_always"])
    )
    print(f"Scarab / durable Celery: {ratio:.2f}x (target >= 2); round by round: {paired}")
    print(json.dumps(rounds))


if __name__ == "__main__":
    main()
