# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_scarab_global_optspecs
    string join \n h/help V/version
end

function __fish_scarab_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_scarab_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_scarab_using_subcommand
    set -l cmd (__fish_scarab_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c scarab -n "__fish_scarab_needs_command" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_needs_command" -s V -l version -d 'Print version'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "serve" -d 'Run the service: HTTP API, engine and executors'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "config" -d 'The configuration file'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "run" -d 'Run one pipeline in-process to completion with live progress. Exits 0 if it succeeded, 1 if it failed or was dead-lettered, 2 for invalid input'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "validate" -d 'Check a pipeline file: exits 0 when valid, 2 with every error on stderr (with `-o json`, in the JSON on stdout) when not'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "schema" -d 'Print the pipeline format\'s JSON Schema'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "completions" -d 'Print the shell completion script for SHELL (the .deb installs bash\'s, zsh\'s and fish\'s)'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "man" -d 'Print the man page, roff, generated from these definitions (the .deb installs it)'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "version" -d 'Print this build\'s version, the commit it was built from, and the store formats it writes and reads'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "explain-pod" -d 'Judge a Pod (`kubectl get pod NAME -o json` or `-o yaml`; `-` reads stdin) exactly as the Kubernetes executor would. Exits 2 when the input is not a Pod'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "submit" -d 'Submit a pipeline to a running service; prints the run id'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "queue" -d 'Admission control: the pools, the locks, and what waits on what in admission order'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "runs" -d 'List runs, newest first'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "show" -d 'Show one run with every attempt, fence, class and reason'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "logs" -d 'Print a step\'s log (stdout by default; the last attempt unless --attempt)'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "schedule" -d 'Schedules: pipelines started at the times a cron expression names'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "dlq" -d 'The dead-letter queue: messages whose deliveries were exhausted'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "backup" -d 'Write a consistent snapshot of the running service\'s whole state to FILE (admin token), fsynced and verified'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "restore" -d 'Replace a stopped service\'s store with a backup: the file is validated, the old store kept aside as scarab.redb.before-restore-TIME, and the swap is atomic'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "requeue" -d 'Release a quarantined run: a fresh try of its failed steps, with new fences'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "discard" -d 'Discard a quarantined run: it stays dead-lettered and is never auto-retried again'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "retry" -d 'Re-run a finished run: its steps that did not succeed start a fresh try (new attempts, new fences); succeeded steps keep their attempts and outputs'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "watch" -d 'Follow a run to its end with live progress on stderr; exit 0 when it succeeded, 1 when it ended otherwise (`-o json`: also the run detail on stdout)'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "cancel" -d 'Cancel a run: running steps are stopped, pending ones never start'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "approve" -d 'Approve a gate: the run goes on past it'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "reject" -d 'Reject a gate: it fails with reason GateRejected, and steps after it are skipped'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "bench" -d 'Measure the performance targets beside this machine\'s limits (docs/benchmarks.md)'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "output" -d 'Inside a step: report an output (`scarab output set KEY VALUE`), fenced by the attempt\'s own token (SCARAB_URL, SCARAB_RUN_ID, SCARAB_STEP, SCARAB_STEP_TOKEN)'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "supervise" -d 'Supervise one local attempt (started by the service; not for direct use)'
complete -c scarab -n "__fish_scarab_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l state-dir -d 'The state dir [file: state_dir]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l listen -d 'The API\'s address [default: 127.0.0.1:7300; file: listen]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l tls-cert -d 'Serve HTTPS with this certificate chain (PEM, leaf first); needs --tls-key [file: tls_cert]. Re-read on SIGHUP' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l tls-key -d 'The private key of --tls-cert (PEM) [file: tls_key]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l log-format -d 'Log format [default: auto; file: log.format]' -r -f -a "auto\t'Human-readable on a terminal; plain lines without timestamps or colours under systemd (journald stamps them)'
human\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l default-step-timeout -d 'Step timeout for steps that name none [default: 1h; file: engine.default_step_timeout]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l infra-retries -d 'Never-started retries every step gets, 0..=20 [default: 3; file: engine.infra_retries]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kill-grace -d 'Grace between SIGTERM and SIGKILL when Scarab stops a step [default: 5s]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l config -d 'The configuration file (TOML; docs/configuration.md)' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l max-deliveries -d 'Deliveries of one outbox message before it is dead-lettered [default: 10]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l log-retention -d 'How long a finished run\'s step logs and attempt directories are kept [default: 7d]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kubeconfig -d 'Run `executor: kubernetes` steps on the cluster of this kubeconfig file' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kube-namespace -d 'The namespace of the step Pods [default: scarab]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kube-grace-image-pull -d 'How long an image pull may keep failing before the attempt is infra_never_started [default: 5m]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kube-grace-config -d 'How long a container configuration error may last [default: 2m]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kube-grace-unschedulable -d 'How long a Pod may stay unschedulable [default: 10m]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kube-grace-pending -d 'How long a Pod may stay pending for any other reason [default: 30m]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kube-delete-grace -d 'The grace period of Scarab\'s Pod deletions (cancel, timeout kill, clean-up): SIGTERM, then SIGKILL after it [default: 30s; file: kubernetes.delete_grace]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kube-callback-url -d 'The API\'s URL as the cluster\'s Pods reach it (`http://10.0.0.5:7300`); set, Pod steps get SCARAB_URL and their attempt\'s token to report outputs [default: none; file: kubernetes.callback_url]' -r
complete -c scarab -n "__fish_scarab_using_subcommand serve" -l kube-in-cluster -d 'Run `executor: kubernetes` steps with the in-cluster service account'
complete -c scarab -n "__fish_scarab_using_subcommand serve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c scarab -n "__fish_scarab_using_subcommand config; and not __fish_seen_subcommand_from check help" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand config; and not __fish_seen_subcommand_from check help" -f -a "check" -d 'Validate a config file with the `SCARAB_*` overrides applied: exit 0 when valid, 2 with the offending key on stderr when not'
complete -c scarab -n "__fish_scarab_using_subcommand config; and not __fish_seen_subcommand_from check help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand config; and __fish_seen_subcommand_from check" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand config; and __fish_seen_subcommand_from check" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "check" -d 'Validate a config file with the `SCARAB_*` overrides applied: exit 0 when valid, 2 with the offending key on stderr when not'
complete -c scarab -n "__fish_scarab_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand run" -l state-dir -d 'Where to keep state [default: $XDG_STATE_HOME/scarab/run/<dir>-<hash>, one per working directory, under ~/.local/state without XDG_STATE_HOME]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand run" -l param -d 'A value for one of the pipeline\'s `params` (repeatable)' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -s o -l output -d 'Output format: `json` prints the finished run\'s detail (as `GET /v1/runs/{id}` answers it) on stdout; the progress stays on stderr' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand run" -l default-step-timeout -d 'Step timeout for steps that name none [default: 1h; file: engine.default_step_timeout]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l infra-retries -d 'Never-started retries every step gets, 0..=20 [default: 3; file: engine.infra_retries]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kill-grace -d 'Grace between SIGTERM and SIGKILL when Scarab stops a step [default: 5s]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l config -d 'The configuration file (TOML; docs/configuration.md)' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand run" -l max-deliveries -d 'Deliveries of one outbox message before it is dead-lettered [default: 10]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l log-retention -d 'How long a finished run\'s step logs and attempt directories are kept [default: 7d]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kubeconfig -d 'Run `executor: kubernetes` steps on the cluster of this kubeconfig file' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kube-namespace -d 'The namespace of the step Pods [default: scarab]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kube-grace-image-pull -d 'How long an image pull may keep failing before the attempt is infra_never_started [default: 5m]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kube-grace-config -d 'How long a container configuration error may last [default: 2m]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kube-grace-unschedulable -d 'How long a Pod may stay unschedulable [default: 10m]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kube-grace-pending -d 'How long a Pod may stay pending for any other reason [default: 30m]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kube-delete-grace -d 'The grace period of Scarab\'s Pod deletions (cancel, timeout kill, clean-up): SIGTERM, then SIGKILL after it [default: 30s; file: kubernetes.delete_grace]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kube-callback-url -d 'The API\'s URL as the cluster\'s Pods reach it (`http://10.0.0.5:7300`); set, Pod steps get SCARAB_URL and their attempt\'s token to report outputs [default: none; file: kubernetes.callback_url]' -r
complete -c scarab -n "__fish_scarab_using_subcommand run" -l kube-in-cluster -d 'Run `executor: kubernetes` steps with the in-cluster service account'
complete -c scarab -n "__fish_scarab_using_subcommand run" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand validate" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand validate" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand schema" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand completions" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand man" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand version" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand version" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand explain-pod" -l now -d 'Judge as of this time (RFC 3339); default: now' -r
complete -c scarab -n "__fish_scarab_using_subcommand explain-pod" -l container -d 'The step\'s container (default: the Pod\'s first container)' -r
complete -c scarab -n "__fish_scarab_using_subcommand explain-pod" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand explain-pod" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l param -d 'A value for one of the pipeline\'s `params` (repeatable)' -r
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l idempotency-key -d 'Resubmitting with the same key returns the same run' -r
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l origin -d 'The producing system, when not this CLI (runs of another origin are never auto-retried)' -r
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l priority -d 'The run\'s priority, -1000..=1000 (higher is admitted first)' -r
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l parallelism -d 'At most this many of the run\'s steps active at once' -r
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l concurrency-group -d 'The run\'s concurrency group' -r
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l concurrency-limit -d 'Runs of the group in progress at once (default 1)' -r
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand submit" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand submit" -s q -l quiet -d 'Print only the run id'
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l wait -d 'Follow the run to its end with live progress on stderr (the id is printed first); exit 0 when it succeeded, 1 when it ended otherwise'
complete -c scarab -n "__fish_scarab_using_subcommand submit" -l supersede -d 'Cancel the group\'s older runs still waiting for a slot'
complete -c scarab -n "__fish_scarab_using_subcommand submit" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand queue" -l limit -d 'Queued steps listed at most' -r
complete -c scarab -n "__fish_scarab_using_subcommand queue" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand queue" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand queue" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand queue" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand queue" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand queue" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand runs" -l state -d 'Only runs in this state' -r -f -a "queued\t''
running\t''
waiting\t''
succeeded\t''
failed\t''
dead_lettered\t''
cancelled\t''
quarantined\t''"
complete -c scarab -n "__fish_scarab_using_subcommand runs" -l limit -d 'Runs listed at most (1 to 500)' -r
complete -c scarab -n "__fish_scarab_using_subcommand runs" -l cursor -d 'Go on from where the previous page ended (the `--cursor` it printed)' -r
complete -c scarab -n "__fish_scarab_using_subcommand runs" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand runs" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand runs" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand runs" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand runs" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand runs" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand show" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand show" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand show" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand show" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand show" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand show" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand logs" -l stream -d '`stdout` or `stderr`' -r -f -a "stdout\t''
stderr\t''"
complete -c scarab -n "__fish_scarab_using_subcommand logs" -l attempt -d 'The attempt\'s number (default: the step\'s latest)' -r
complete -c scarab -n "__fish_scarab_using_subcommand logs" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand logs" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand logs" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand logs" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand logs" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand logs" -s f -l follow -d 'Keep printing until the attempt finishes; waits for a step that has not started yet'
complete -c scarab -n "__fish_scarab_using_subcommand logs" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -f -a "create" -d 'Create a schedule that starts FILE\'s pipeline at the times CRON names'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -f -a "list" -d 'List every schedule: next fire (on its own clock) and last run'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -f -a "show" -d 'Show one schedule with its next fires and its last skipped fire'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -f -a "pause" -d 'Stop firing until resumed'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -f -a "resume" -d 'Fire again, from the next fire after now (paused fires are not caught up)'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -f -a "delete" -d 'Delete a schedule; runs it started go on'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and not __fish_seen_subcommand_from create list show pause resume delete help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -l cron -d 'Five fields (minute hour day-of-month month day-of-week), or six with seconds first, e.g. "0 2 * * *" (02:00 every day)' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -l timezone -d 'An IANA time zone the expression is read in, e.g. Europe/Berlin [default: UTC]' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -l param -d 'A value for one of the pipeline\'s `params` (repeatable)' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -l catch-up -d 'Fires missed while the service was down: one run for all of them, or none [default: one]' -r -f -a "none\t''
one\t''"
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -l overlap -d 'A fire while the previous run is unfinished: start anyway, or skip it [default: allow]' -r -f -a "allow\t''
skip\t''"
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from create" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from list" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from list" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from list" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from list" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from list" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from show" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from show" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from show" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from show" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from show" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from pause" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from pause" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from pause" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from pause" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from pause" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from pause" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from resume" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from resume" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from resume" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from resume" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from resume" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from resume" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from delete" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from delete" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from delete" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from delete" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from delete" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from delete" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from help" -f -a "create" -d 'Create a schedule that starts FILE\'s pipeline at the times CRON names'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from help" -f -a "list" -d 'List every schedule: next fire (on its own clock) and last run'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from help" -f -a "show" -d 'Show one schedule with its next fires and its last skipped fire'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from help" -f -a "pause" -d 'Stop firing until resumed'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from help" -f -a "resume" -d 'Fire again, from the next fire after now (paused fires are not caught up)'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from help" -f -a "delete" -d 'Delete a schedule; runs it started go on'
complete -c scarab -n "__fish_scarab_using_subcommand schedule; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -f -a "list" -d 'List dead letters, oldest first'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -f -a "show" -d 'Show one dead letter'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -f -a "requeue" -d 'Put it back in the outbox with a fresh delivery budget (its run resumes)'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -f -a "discard" -d 'Drop it for good; the reason is recorded in the run\'s history'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and not __fish_seen_subcommand_from list show requeue discard help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from list" -l after -d 'Start after this dead letter\'s id (the `--after` the previous page printed)' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from list" -l limit -d 'Dead letters listed at most' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from list" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from list" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from list" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from list" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from list" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from show" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from show" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from show" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from show" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from show" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from requeue" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from requeue" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from requeue" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from requeue" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from requeue" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from requeue" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from discard" -l reason -d 'Why, kept in the run\'s history' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from discard" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from discard" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from discard" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from discard" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from discard" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from discard" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from help" -f -a "list" -d 'List dead letters, oldest first'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from help" -f -a "show" -d 'Show one dead letter'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from help" -f -a "requeue" -d 'Put it back in the outbox with a fresh delivery budget (its run resumes)'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from help" -f -a "discard" -d 'Drop it for good; the reason is recorded in the run\'s history'
complete -c scarab -n "__fish_scarab_using_subcommand dlq; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand backup" -l out -d 'Where to write the backup; an existing file is never overwritten' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand backup" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand backup" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand backup" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand backup" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand backup" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand backup" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand restore" -l state-dir -d 'The state dir of the stopped service whose store is replaced' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand restore" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand requeue" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand requeue" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand requeue" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand requeue" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand requeue" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand requeue" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand discard" -l reason -d 'Why, kept in the run\'s history' -r
complete -c scarab -n "__fish_scarab_using_subcommand discard" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand discard" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand discard" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand discard" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand discard" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand discard" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand retry" -l from -d 'Also re-run this step and every step downstream of it, even if they succeeded (allowed on a succeeded run too)' -r
complete -c scarab -n "__fish_scarab_using_subcommand retry" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand retry" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand retry" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand retry" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand retry" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand retry" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand watch" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand watch" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand watch" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand watch" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand watch" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand watch" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand cancel" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand cancel" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand cancel" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand cancel" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand cancel" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand cancel" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand approve" -l comment -d 'A comment kept with the decision' -r
complete -c scarab -n "__fish_scarab_using_subcommand approve" -l by -d 'Your name as recorded (default: $USER, else the token\'s identity)' -r
complete -c scarab -n "__fish_scarab_using_subcommand approve" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand approve" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand approve" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand approve" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand approve" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand approve" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand reject" -l comment -d 'A comment kept with the decision' -r
complete -c scarab -n "__fish_scarab_using_subcommand reject" -l by -d 'Your name as recorded (default: $USER, else the token\'s identity)' -r
complete -c scarab -n "__fish_scarab_using_subcommand reject" -l url -d 'Base URL of the service' -r
complete -c scarab -n "__fish_scarab_using_subcommand reject" -l token -d 'API token (default: read from --state-dir\'s admin.token)' -r
complete -c scarab -n "__fish_scarab_using_subcommand reject" -l state-dir -d 'State dir of a local service, to read its admin token from' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand reject" -l ca-cert -d 'For an https:// URL whose certificate a private CA signed: that CA\'s certificate (PEM) [default: the system\'s roots]' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand reject" -s o -l output -d 'Output format' -r -f -a "table\t''
json\t''"
complete -c scarab -n "__fish_scarab_using_subcommand reject" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand bench" -l dir -d 'Scratch directory (on the disk to measure)' -r -F
complete -c scarab -n "__fish_scarab_using_subcommand bench" -l stored-runs -d 'Finished runs to store for the start-up measurement' -r
complete -c scarab -n "__fish_scarab_using_subcommand bench" -l inflight -d 'In-flight attempts to store for the start-up measurement' -r
complete -c scarab -n "__fish_scarab_using_subcommand bench" -l crash-steps -d 'Steps in flight when the service is killed' -r
complete -c scarab -n "__fish_scarab_using_subcommand bench" -l dead-lettered -d 'Dead-lettered runs in the store for the auto-retry sweep measurement' -r
complete -c scarab -n "__fish_scarab_using_subcommand bench" -l queued -d 'Queued steps for the admission control measurements' -r
complete -c scarab -n "__fish_scarab_using_subcommand bench" -l only -d 'Run only this measurement (`throughput`, `sweep`, `admission`, `dashboard`)' -r
complete -c scarab -n "__fish_scarab_using_subcommand bench" -l quick -d 'Fewer iterations, for a smoke run'
complete -c scarab -n "__fish_scarab_using_subcommand bench" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand output; and not __fish_seen_subcommand_from set help" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand output; and not __fish_seen_subcommand_from set help" -f -a "set" -d 'Store KEY = VALUE for this attempt; refused (exit 2) if a newer attempt exists'
complete -c scarab -n "__fish_scarab_using_subcommand output; and not __fish_seen_subcommand_from set help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand output; and __fish_seen_subcommand_from set" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand output; and __fish_seen_subcommand_from help" -f -a "set" -d 'Store KEY = VALUE for this attempt; refused (exit 2) if a newer attempt exists'
complete -c scarab -n "__fish_scarab_using_subcommand output; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand supervise" -l zygote -d 'Fork supervisors on the service\'s request (stdin is its socket)'
complete -c scarab -n "__fish_scarab_using_subcommand supervise" -s h -l help -d 'Print help'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "serve" -d 'Run the service: HTTP API, engine and executors'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "config" -d 'The configuration file'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "run" -d 'Run one pipeline in-process to completion with live progress. Exits 0 if it succeeded, 1 if it failed or was dead-lettered, 2 for invalid input'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "validate" -d 'Check a pipeline file: exits 0 when valid, 2 with every error on stderr (with `-o json`, in the JSON on stdout) when not'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "schema" -d 'Print the pipeline format\'s JSON Schema'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "completions" -d 'Print the shell completion script for SHELL (the .deb installs bash\'s, zsh\'s and fish\'s)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "man" -d 'Print the man page, roff, generated from these definitions (the .deb installs it)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "version" -d 'Print this build\'s version, the commit it was built from, and the store formats it writes and reads'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "explain-pod" -d 'Judge a Pod (`kubectl get pod NAME -o json` or `-o yaml`; `-` reads stdin) exactly as the Kubernetes executor would. Exits 2 when the input is not a Pod'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "submit" -d 'Submit a pipeline to a running service; prints the run id'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "queue" -d 'Admission control: the pools, the locks, and what waits on what in admission order'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "runs" -d 'List runs, newest first'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "show" -d 'Show one run with every attempt, fence, class and reason'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "logs" -d 'Print a step\'s log (stdout by default; the last attempt unless --attempt)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "schedule" -d 'Schedules: pipelines started at the times a cron expression names'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "dlq" -d 'The dead-letter queue: messages whose deliveries were exhausted'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "backup" -d 'Write a consistent snapshot of the running service\'s whole state to FILE (admin token), fsynced and verified'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "restore" -d 'Replace a stopped service\'s store with a backup: the file is validated, the old store kept aside as scarab.redb.before-restore-TIME, and the swap is atomic'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "requeue" -d 'Release a quarantined run: a fresh try of its failed steps, with new fences'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "discard" -d 'Discard a quarantined run: it stays dead-lettered and is never auto-retried again'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "retry" -d 'Re-run a finished run: its steps that did not succeed start a fresh try (new attempts, new fences); succeeded steps keep their attempts and outputs'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "watch" -d 'Follow a run to its end with live progress on stderr; exit 0 when it succeeded, 1 when it ended otherwise (`-o json`: also the run detail on stdout)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "cancel" -d 'Cancel a run: running steps are stopped, pending ones never start'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "approve" -d 'Approve a gate: the run goes on past it'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "reject" -d 'Reject a gate: it fails with reason GateRejected, and steps after it are skipped'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "bench" -d 'Measure the performance targets beside this machine\'s limits (docs/benchmarks.md)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "output" -d 'Inside a step: report an output (`scarab output set KEY VALUE`), fenced by the attempt\'s own token (SCARAB_URL, SCARAB_RUN_ID, SCARAB_STEP, SCARAB_STEP_TOKEN)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "supervise" -d 'Supervise one local attempt (started by the service; not for direct use)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and not __fish_seen_subcommand_from serve config run validate schema completions man version explain-pod submit queue runs show logs schedule dlq backup restore requeue discard retry watch cancel approve reject bench output supervise help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from config" -f -a "check" -d 'Validate a config file with the `SCARAB_*` overrides applied: exit 0 when valid, 2 with the offending key on stderr when not'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from schedule" -f -a "create" -d 'Create a schedule that starts FILE\'s pipeline at the times CRON names'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from schedule" -f -a "list" -d 'List every schedule: next fire (on its own clock) and last run'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from schedule" -f -a "show" -d 'Show one schedule with its next fires and its last skipped fire'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from schedule" -f -a "pause" -d 'Stop firing until resumed'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from schedule" -f -a "resume" -d 'Fire again, from the next fire after now (paused fires are not caught up)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from schedule" -f -a "delete" -d 'Delete a schedule; runs it started go on'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from dlq" -f -a "list" -d 'List dead letters, oldest first'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from dlq" -f -a "show" -d 'Show one dead letter'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from dlq" -f -a "requeue" -d 'Put it back in the outbox with a fresh delivery budget (its run resumes)'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from dlq" -f -a "discard" -d 'Drop it for good; the reason is recorded in the run\'s history'
complete -c scarab -n "__fish_scarab_using_subcommand help; and __fish_seen_subcommand_from output" -f -a "set" -d 'Store KEY = VALUE for this attempt; refused (exit 2) if a newer attempt exists'
