//! Every bound Scarab enforces, in one place (docs/pipeline.md and docs/api.md list them
//! for users).
//!
//! Hitting one of these is a handled, reported error naming the limit, never a panic.

use std::time::Duration;

// --- The pipeline file -------------------------------------------------------------

/// Largest pipeline document accepted (YAML or JSON), in bytes.
pub const PIPELINE_MAX_BYTES: usize = 256 * 1024;
/// Largest YAML nesting depth.
pub const PIPELINE_MAX_DEPTH: usize = 32;
pub const PIPELINE_NAME_MAX_CHARS: usize = 100;
pub const STEPS_MAX: usize = 100;
/// Step names: `[A-Za-z0-9_-]`, at most this many characters.
pub const STEP_NAME_MAX_CHARS: usize = 63;
pub const ARGV_MAX_ITEMS: usize = 256;
pub const ARGV_ITEM_MAX_BYTES: usize = 4096;
pub const ARGV_TOTAL_MAX_BYTES: usize = 64 * 1024;
pub const ENV_MAX_VARS: usize = 100;
pub const ENV_NAME_MAX_BYTES: usize = 128;
pub const ENV_VALUE_MAX_BYTES: usize = 4096;
/// Pipeline parameters: how many, and the bounds of a name, a value, a pattern (as
/// written and compiled) and a description.
pub const PARAMS_MAX: usize = 32;
pub const PARAM_NAME_MAX_BYTES: usize = 64;
pub const PARAM_VALUE_MAX_BYTES: usize = 1024;
pub const PARAM_PATTERN_MAX_BYTES: usize = 1024;
pub const PARAM_PATTERN_COMPILED_MAX_BYTES: usize = 1 << 20;
pub const PARAM_DESCRIPTION_MAX_BYTES: usize = 1024;
/// `kubernetes.callback_url`: it becomes a Pod's `SCARAB_URL`, so an environment value.
pub const CALLBACK_URL_MAX_BYTES: usize = 2048;

/// A secret's name (`env: {VAR: {secret: NAME}}`, a file name under the secrets dir, a
/// Kubernetes Secret's name).
pub const SECRET_NAME_MAX_BYTES: usize = 63;
/// A secret's value (its file, less one trailing newline).
pub const SECRET_VALUE_MAX_BYTES: usize = 64 * 1024;
/// Secrets in the secrets dir.
pub const SECRETS_MAX: usize = 1024;

/// `[a-z0-9]([a-z0-9.-]*[a-z0-9])?`, at most [`SECRET_NAME_MAX_BYTES`]: a file name and a
/// Kubernetes Secret name alike.
pub fn is_secret_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= SECRET_NAME_MAX_BYTES
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes.iter().all(|b| edge(b) || *b == b'-' || *b == b'.')
}
pub const ENV_TOTAL_MAX_BYTES: usize = 64 * 1024;
pub const WORKDIR_MAX_BYTES: usize = 4096;
/// A Kubernetes step's image reference.
pub const IMAGE_MAX_BYTES: usize = 512;
/// Entries of a Kubernetes step's `node_selector`, `resources.requests` or `.limits`.
pub const POD_MAP_MAX_ENTRIES: usize = 32;
pub const STEP_TIMEOUT_MIN: Duration = Duration::from_secs(1);
pub const STEP_TIMEOUT_MAX: Duration = Duration::from_secs(7 * 24 * 3600);
/// `retry.max`: retries, so at most this plus one attempts by the author's policy.
pub const RETRY_MAX: u32 = 20;
/// A gate's `auto_release` and `expires`: at least a second, at most a year.
pub const GATE_WAIT_MIN: Duration = Duration::from_secs(1);
pub const GATE_WAIT_MAX: Duration = Duration::from_secs(365 * 24 * 3600);
/// A gate's `message`.
pub const GATE_MESSAGE_MAX_BYTES: usize = 1024;
/// A pipeline's `budget`: at least a second, at most 30 days of active time.
pub const BUDGET_MIN: Duration = Duration::from_secs(1);
pub const BUDGET_MAX: Duration = Duration::from_secs(30 * 24 * 3600);
/// A gate decision's comment.
pub const GATE_COMMENT_MAX_BYTES: usize = 2048;
pub const BACKOFF_INITIAL_MIN: Duration = Duration::from_millis(10);
pub const BACKOFF_MAX_MAX: Duration = Duration::from_secs(24 * 3600);
pub const BACKOFF_FACTOR_MIN: f64 = 1.0;
pub const BACKOFF_FACTOR_MAX: f64 = 10.0;

// --- The HTTP API ------------------------------------------------------------------

/// A client must send a request's headers within this; it also closes idle keep-alive
/// connections.
pub const HTTP_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Request headers above this are refused (431) before they are read further.
pub const HTTP_HEADER_MAX_BYTES: usize = 64 * 1024;
/// A request must be answered within this (its response may stream longer); the
/// backup, which copies the whole store first, is exempt.
pub const HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Open client connections at most (and at most a quarter of the open-files limit);
/// beyond it a new connection is closed at once.
pub const HTTP_CONNECTIONS_MAX: usize = 4096;
/// Request bodies above this are refused with 413.
pub const API_BODY_MAX_BYTES: usize = 1024 * 1024;
/// Valid pipeline documents the API keeps parsed, by text and parameter values (a
/// producer submitting the same document is not parsed each time), and the longest
/// document kept.
pub const PARSED_PIPELINES_MAX: usize = 16;
pub const PARSED_PIPELINE_TEXT_MAX_BYTES: usize = 16 * 1024;
/// The largest parsed pipeline kept (its `Debug` rendering's length): a short document
/// can name a large one through YAML aliases.
pub const PARSED_PIPELINE_MAX_BYTES: usize = 64 * 1024;
pub const API_PAGE_DEFAULT: usize = 50;
pub const API_PAGE_MAX: usize = 500;
pub const IDEMPOTENCY_KEY_MAX_BYTES: usize = 200;
pub const HISTORY_PAGE_MAX: usize = 1000;
/// The newest events `GET /v1/events` keeps for clients that resume with `Last-Event-ID`.
pub const EVENTS_BUFFER: usize = 8192;
/// Open `GET /v1/events` streams at most; one more is refused with 503.
pub const EVENT_STREAMS_MAX: usize = 64;
/// An event stream with nothing to send sends a comment this often.
pub const EVENTS_KEEPALIVE: Duration = Duration::from_secs(15);
/// Events a stream takes from the buffer at a time.
pub const EVENTS_CHUNK: usize = 256;
/// Largest slice of a step log returned by one request.
pub const LOG_CHUNK_MAX_BYTES: u64 = 1024 * 1024;
pub const ORIGIN_MAX_BYTES: usize = 100;

// --- The engine and the driver -----------------------------------------------------

/// Inputs folded into one write transaction (group commit).
pub const COMMIT_BATCH_MAX: usize = 512;
/// Queued inputs before submitters wait (backpressure).
pub const INPUT_QUEUE_MAX: usize = 8192;
/// Due timers fired per transaction.
pub const TIMER_BATCH_MAX: usize = 512;
/// The forward-progress check (over every non-terminal run) runs at most this often.
pub const PROGRESS_CHECK_MIN_INTERVAL: Duration = Duration::from_secs(5);
/// Global bound on never-started retries regardless of the step's own policy.
pub const INFRA_RETRIES_MAX: u32 = 20;
/// Fences are minted below this (2^62): minting past it is refused, and a fence at or
/// above it found on an executor is not Scarab's.
pub const FENCE_MAX: u64 = 1 << 62;
/// How far above the store's counter a fence found on an executor may be and still
/// count as this lineage's (2^40: a restored backup would have to be older than a
/// trillion attempts). Anything farther is a foreign zombie, stopped and not counted.
pub const FENCE_LEAD_MAX: u64 = 1 << 40;
/// History events kept per run; beyond it new ones are not recorded (the earliest are
/// kept) and the service logs a warning.
pub const HISTORY_EVENTS_PER_RUN_MAX: u32 = 10_000;

// --- The store ----------------------------------------------------------------------

/// One stored record, encoded (a pipeline source is the largest: `PIPELINE_MAX_BYTES`).
pub const RECORD_MAX_BYTES: usize = 4 * 1024 * 1024;
/// redb page cache (its write buffer takes at most half). It fills with every page the
/// driver writes, and stays full: at 32 MiB the service held 58 MB once the store passed
/// it, against 28 MB at 4 MiB, at the same speed (docs/benchmarks.md, "Memory after
/// use"). What a transition reads is the right-hand edges of its trees (run ids and
/// times grow), a few hundred pages; anything colder is one `pread` from the kernel's
/// page cache away.
pub const STORE_CACHE_BYTES: usize = 4 * 1024 * 1024;

// --- The outbox --------------------------------------------------------------------

/// Messages read per dispatcher pass.
pub const OUTBOX_BATCH_MAX: usize = 512;
/// Deliveries in flight at once.
pub const OUTBOX_CONCURRENCY_MAX: usize = 256;
pub const OUTBOX_BACKOFF_INITIAL: Duration = Duration::from_millis(200);
pub const OUTBOX_BACKOFF_MAX: Duration = Duration::from_secs(60);
pub const OUTBOX_ERROR_MAX_BYTES: usize = 2048;

// --- The local executor ------------------------------------------------------------

/// Grace between SIGTERM and SIGKILL when Scarab stops a step.
pub const KILL_GRACE: Duration = Duration::from_secs(5);
/// Extra time the engine backstop allows past a step's timeout before it steps in.
pub const BACKSTOP_SLACK: Duration = Duration::from_secs(30);
/// Names in `engine.step_env_passthrough`.
pub const STEP_ENV_PASSTHROUGH_MAX: usize = 64;
/// Distinct outputs one attempt may store.
pub const OUTPUTS_PER_ATTEMPT_MAX: usize = 32;
/// Verdict reasons and messages are cut to this length.
pub const REASON_MAX_BYTES: usize = 1024;

/// A run's `priority`: higher is admitted first.
pub const PRIORITY_MIN: i32 = -1000;
pub const PRIORITY_MAX: i32 = 1000;
/// A concurrency group's name.
pub const GROUP_NAME_MAX_BYTES: usize = 128;
/// A concurrency group's `limit`.
pub const GROUP_LIMIT_MAX: u32 = 10_000;
/// A local step's `slots`.
pub const SLOTS_MAX: u32 = 4096;
/// A step's `locks`, and a lock's name.
pub const LOCKS_PER_STEP_MAX: usize = 8;
pub const LOCK_NAME_MAX_BYTES: usize = 63;
/// `[[locks]]` in the configuration, and each lock's `limit`.
pub const LOCKS_MAX: usize = 256;
pub const LOCK_LIMIT_MAX: u32 = 10_000;
/// `engine.max_parallel_local` and `kubernetes.max_pods`.
pub const POOL_LIMIT_MAX: u32 = 100_000;

/// `engine.prepared_local`'s default is one per local slot, at most this many: each is a
/// supervisor waiting at the launch handshake.
pub const PREPARED_LOCAL_DEFAULT_MAX: u32 = 4;
/// `engine.prepared_local` at most.
pub const PREPARED_LOCAL_MAX: u32 = 256;
/// `engine.priority_aging`: one point of priority is worth this much waiting.
pub const PRIORITY_AGING_MIN: Duration = Duration::from_secs(1);
pub const PRIORITY_AGING_MAX: Duration = Duration::from_secs(24 * 3600);
/// Space kept in reserve in the state dir (`STATE/reserve`): freed when the disk fills,
/// so verdicts, kills and cancels can still be recorded; made again once space returns.
pub const DISK_RESERVE_BYTES: u64 = 4 * 1024 * 1024;
/// How often a full disk is checked for space again.
pub const DISK_RECHECK: Duration = Duration::from_secs(1);
/// Largest attempt file read (`attempt.jsonl` holds a spec, a few identities and a
/// verdict: far less); a larger one is refused as unreadable.
pub const ATTEMPT_FILE_MAX_BYTES: u64 = 4 * 1024 * 1024;
/// How long a supervisor keeps trying to write a verdict the full disk refuses.
pub const VERDICT_WRITE_PATIENCE: Duration = Duration::from_secs(600);
/// Supervisors the zygote keeps waiting for the next local attempt, how long each waits
/// before it ends, and how many attempts one serves before it ends.
pub const SUPERVISORS_KEPT_FREE: usize = 4;
pub const SUPERVISOR_KEPT_FOR: Duration = Duration::from_secs(5);
pub const SUPERVISOR_ATTEMPTS_MAX: usize = 10_000;

/// A change of the wall clock against Scarab's own time larger than this is logged as a
/// step.
pub const CLOCK_STEP_NOTICED_MS: i64 = 2_000;

/// `engine.max_active_runs` at most.
pub const ACTIVE_RUNS_MAX: u32 = 10_000_000;
/// Entries `GET /v1/queue` lists at most.
pub const QUEUE_LIST_MAX: usize = 1000;

/// A lock or concurrency group name: 1 to `max` bytes of `[A-Za-z0-9_.-]`.
pub fn check_admission_name(name: &str, max: usize) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > max {
        return Err(format!(
            "must be at most {max} bytes (found {})",
            name.len()
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err("must match [A-Za-z0-9_.-]+".into());
    }
    Ok(())
}

/// Cuts `text` to at most `max_bytes`, on a character boundary.
pub fn clip(text: &str, max_bytes: usize) -> String {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

// --- Schedules ------------------------------------------------------------------------

/// Schedules the store holds at most.
pub const SCHEDULES_MAX: usize = 1000;
/// A schedule's name: `check_admission_name` with this bound.
pub const SCHEDULE_NAME_MAX_BYTES: usize = 63;
/// A schedule's cron expression.
pub const SCHEDULE_CRON_MAX_BYTES: usize = 128;
/// A schedule's time zone name.
pub const SCHEDULE_TIMEZONE_MAX_BYTES: usize = 64;
/// A skipped fire's reason as stored.
pub const SCHEDULE_REASON_MAX_BYTES: usize = 512;
/// Missed fires counted one by one after downtime; beyond this a skip says "or more".
pub const SCHEDULE_MISSED_COUNTED: u64 = 1000;
/// Due schedules one batch of the driver takes.
pub const SCHEDULE_FIRE_BATCH_MAX: usize = 64;
/// Upcoming fires a schedule's answer lists.
pub const SCHEDULE_UPCOMING: usize = 5;
