//! Starting a step from the supervisor's own thread.
//!
//! A step must start with its own umask, its own Landlock domain and `no_new_privs`, all
//! of which bind the task that takes them on, never the supervisor. The step is therefore
//! started the way `posix_spawn` starts a process: a `clone` that shares this process's
//! memory and suspends the calling thread until the child has executed the program or
//! failed (`CLONE_VM | CLONE_VFORK`, no copy of the supervisor's memory to make and tear
//! down), and the child puts everything in place for itself before `execve`. Unlike
//! `posix_spawn`, the child can take on the confinement, so no thread of the supervisor
//! has to be confined, and none has to be started per attempt: with a thread of its own
//! to spawn from, each attempt paid for a thread's start and end and two hand-offs
//! between threads on the way from the go to the step (docs/benchmarks.md, "A step
//! spawned from the supervisor's thread").
//!
//! The child runs in the supervisor's memory, so it runs only system calls on values
//! prepared beforehand: it allocates nothing, takes no lock and returns nowhere. Every
//! signal but glibc's own two is blocked across the clone (glibc never blocks those; its
//! handlers ignore what is not meant for one of its threads, and the child is none);
//! the child sets every signal's action to its default before it unblocks them, so no
//! handler of the supervisor runs in it, and the step starts with no signal ignored or
//! blocked. The child is created with a pidfd (`CLONE_PIDFD`), so its exit is watched
//! without a race against the reuse of its pid. Kernels before 5.2 ignore that flag and
//! give none (the exit is then looked for instead); 5.2 gives a pidfd that `poll` does
//! not yet understand, and is not supported. Needs glibc 2.24 or later, whose `clone`
//! leaves the parent's cached thread ids alone (the package requires 2.36).

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};

use super::confine::Confinement;

/// The child's stack. The child calls only a few functions that make system calls.
const STACK: usize = 64 * 1024;

/// Below the stack, one page that faults: an overflow ends the child instead of writing
/// over whatever mapping lies beneath.
const GUARD: usize = 4096;

/// One more than the highest signal number on Linux (`_NSIG`).
const SIGNALS: libc::c_int = 65;

/// What to start.
pub struct Request<'a> {
    /// `argv`; the first is the program, looked up in the `PATH` of `env` when it holds
    /// no slash.
    pub argv: &'a [String],
    /// The step's whole environment.
    pub env: &'a BTreeMap<OsString, OsString>,
    pub workdir: Option<&'a Path>,
    pub umask: Option<rustix::fs::Mode>,
    /// `None`: unconfined (tests).
    pub confinement: Option<&'a Confinement>,
}

/// Why the step did not start.
#[derive(Debug)]
pub enum Failure {
    /// Its confinement could not be put in place.
    Confine(io::Error),
    /// Anything else: preparing it, its working directory, its executable.
    Exec(io::Error),
}

/// A started step: its own process group (its pgid is its pid), stdin from `/dev/null`,
/// stdout and stderr into the pipes whose read ends these are.
pub struct Step {
    pid: i32,
    /// Once reaped: its pid may belong to another process from then on.
    status: Option<ExitStatus>,
    /// Readable once the step has exited; `None` on kernels without `CLONE_PIDFD`.
    pub pidfd: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

impl Step {
    /// Its pid, which is also its process group's id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Its exit status, if it has exited (it is reaped then).
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.wait_with(libc::WNOHANG)
    }

    /// Waits for it to exit and reaps it.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.wait_with(0)? {
                return Ok(status);
            }
        }
    }

    fn wait_with(&mut self, options: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if self.status.is_some() {
            return Ok(self.status);
        }
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid place for the kernel to write the status to.
        match unsafe { libc::waitpid(self.pid, &mut status, options) } {
            0 => Ok(None),
            -1 => {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    return Ok(None);
                }
                Err(error)
            }
            _ => {
                self.status = Some(ExitStatus::from_raw(status));
                Ok(self.status)
            }
        }
    }
}

/// Where the child got to when it gave up (`Report::stage`).
const CONFINE: u8 = 1;
const EXEC: u8 = 2;

/// What the child leaves in the shared memory when it gives up before `execve` succeeds.
#[derive(Default)]
struct Report {
    stage: AtomicU8,
    errno: AtomicI32,
}

/// Everything the child uses, prepared by the parent (the child allocates nothing).
struct Plan<'a> {
    /// The paths `execve` is tried with, in order (the `PATH` lookup done beforehand).
    programs: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    workdir: Option<CString>,
    umask: Option<libc::mode_t>,
    confinement: Option<&'a Confinement>,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    report: Report,
}

/// Starts the step; returns once it has executed its program (or failed to).
pub fn start(request: &Request<'_>) -> Result<Step, Failure> {
    let exec = Failure::Exec;
    let argv: Vec<CString> = request
        .argv
        .iter()
        .map(|arg| c_string(arg.as_bytes()))
        .collect::<io::Result<_>>()
        .map_err(exec)?;
    let program = request
        .argv
        .first()
        .ok_or_else(|| Failure::Exec(io::Error::from(io::ErrorKind::InvalidInput)))?;
    let envp: Vec<CString> = request
        .env
        .iter()
        .map(|(name, value)| {
            let mut pair = name.clone().into_vec();
            pair.push(b'=');
            pair.extend_from_slice(value.as_bytes());
            c_string(&pair)
        })
        .collect::<io::Result<_>>()
        .map_err(exec)?;
    let programs =
        candidates(program, request.env.get(std::ffi::OsStr::new("PATH"))).map_err(exec)?;
    let workdir = request
        .workdir
        .map(|dir| c_string(dir.as_os_str().as_bytes()))
        .transpose()
        .map_err(exec)?;
    let stdin = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| Failure::Exec(e.into()))
    .and_then(|fd| above_stdio(fd).map_err(exec))?;
    let (stdout, stdout_w) = pipe().map_err(exec)?;
    let (stderr, stderr_w) = pipe().map_err(exec)?;
    let (stdout_w, stderr_w) = (
        above_stdio(stdout_w).map_err(exec)?,
        above_stdio(stderr_w).map_err(exec)?,
    );
    let plan = Plan {
        programs,
        argv: null_terminated(&argv),
        envp: null_terminated(&envp),
        workdir,
        umask: request.umask.map(|mask| mask.bits() as libc::mode_t),
        confinement: request.confinement,
        stdin: stdin.as_raw_fd(),
        stdout: stdout_w.as_raw_fd(),
        stderr: stderr_w.as_raw_fd(),
        report: Report::default(),
    };
    let (pid, pidfd) = clone_child(&plan).map_err(exec)?;
    // Ours are closed: the step holds the only write ends, so the pipes end with it.
    drop((stdin, stdout_w, stderr_w));
    match plan.report.stage.load(Ordering::Acquire) {
        0 => Ok(Step {
            pid,
            status: None,
            pidfd,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }),
        stage => {
            // The child has exited: reaped here, it never shows as a step.
            let mut status = 0;
            // SAFETY: `status` is a valid place to write to.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            let error = io::Error::from_raw_os_error(plan.report.errno.load(Ordering::Acquire));
            Err(if stage == CONFINE {
                Failure::Confine(error)
            } else {
                Failure::Exec(error)
            })
        }
    }
}

/// A C string of `bytes`, or `InvalidInput` for a NUL inside (the kernel could not take
/// it), as the standard library reports it.
fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument or environment value holds a NUL byte",
        )
    })
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The paths to execute `program` as: itself when it holds a slash, else each directory
/// of `path` (`/bin:/usr/bin` without one, an empty entry meaning the working directory)
/// joined with it, as `execvp` looks it up.
fn candidates(program: &str, path: Option<&OsString>) -> io::Result<Vec<CString>> {
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if program.contains('/') {
        return Ok(vec![c_string(program.as_bytes())?]);
    }
    let path = path.map_or(b"/bin:/usr/bin".as_slice(), |p| p.as_bytes());
    path.split(|&b| b == b':')
        .map(|dir| {
            let mut full = if dir.is_empty() {
                b".".to_vec()
            } else {
                dir.to_vec()
            };
            full.push(b'/');
            full.extend_from_slice(program.as_bytes());
            c_string(&full)
        })
        .collect()
}

/// `fd`, moved above the three standard descriptors if it is one of them (a process that
/// started with one closed gets it back from its next `open`), so that the child's `dup2`
/// onto 0, 1 and 2 never overwrites a descriptor it has yet to copy.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
}

/// A pipe, both ends close-on-exec: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// The clone itself: every signal blocked across it, the child on a stack of its own.
/// Returns the child's pid and pidfd once it has executed its program or exited.
fn clone_child(plan: &Plan<'_>) -> io::Result<(i32, Option<OwnedFd>)> {
    // SAFETY: a fresh private anonymous mapping, unmapped below and used only as the
    // child's stack while this thread is suspended.
    let mapping = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            GUARD + STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if mapping == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the mapping's first page, made inaccessible; the stack is the rest.
    let (guarded, stack) = unsafe {
        (
            libc::mprotect(mapping, GUARD, libc::PROT_NONE) == 0,
            mapping.cast::<u8>().add(GUARD).cast::<libc::c_void>(),
        )
    };
    if !guarded {
        let error = io::Error::last_os_error();
        // SAFETY: the mapping made above, not used by anything yet.
        unsafe { libc::munmap(mapping, GUARD + STACK) };
        return Err(error);
    }
    let blocked = Blocked::all();
    let mut cloned = clone_with(plan, stack, true);
    if matches!(&cloned, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) {
        // Refused outright (not the way kernels before 5.2 take it: they ignore the flag
        // and give no pidfd, which `clone_with` sees): the exit is then looked for.
        cloned = clone_with(plan, stack, false);
    }
    drop(blocked);
    // SAFETY: the mapping made above; the child no longer uses it (it has executed its
    // program or exited, or was never created).
    unsafe { libc::munmap(mapping, GUARD + STACK) };
    cloned
}

fn clone_with(
    plan: &Plan<'_>,
    stack: *mut libc::c_void,
    with_pidfd: bool,
) -> io::Result<(i32, Option<OwnedFd>)> {
    let mut pidfd: libc::c_int = -1;
    let flags = libc::CLONE_VM
        | libc::CLONE_VFORK
        | libc::SIGCHLD
        | if with_pidfd { libc::CLONE_PIDFD } else { 0 };
    // SAFETY: the child runs `child` on its own stack inside our memory while this thread
    // is suspended (CLONE_VFORK); `plan` outlives it, and `child` only makes system calls
    // on what `plan` holds. The stack grows down from the mapping's end.
    let pid = unsafe {
        libc::clone(
            child,
            stack.cast::<u8>().add(STACK).cast(),
            flags,
            std::ptr::from_ref(plan).cast_mut().cast(),
            &mut pidfd as *mut libc::c_int,
        )
    };
    if pid == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: with CLONE_PIDFD the kernel stored a new descriptor that nothing else owns.
    let pidfd = (with_pidfd && pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Ok((pid, pidfd))
}

/// Every signal blocked in the calling thread until dropped.
struct Blocked(libc::sigset_t);

impl Blocked {
    fn all() -> Blocked {
        // SAFETY: sigset_t is plain data, filled by sigfillset before use; the old mask is
        // written into `old`.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            Blocked(old)
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `all`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// The child, until `execve`. Only system calls on what `plan` holds; never returns.
extern "C" fn child(plan: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `clone_with` passes a `Plan` that outlives the child's use of it.
    let plan = unsafe { &*(plan as *const Plan<'_>) };
    let give_up = |stage: u8, errno: i32| -> ! {
        plan.report.errno.store(errno, Ordering::Release);
        plan.report.stage.store(stage, Ordering::Release);
        // SAFETY: ends the child at once, running nothing of the supervisor's.
        unsafe { libc::_exit(127) }
    };
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY (every call below): system calls on integers and on memory `plan` owns, in a
    // child that shares the memory of a suspended parent.
    unsafe {
        // Every action to its default while every signal is still blocked: a handler of
        // the supervisor must never run here, and the step ignores nothing it inherited.
        for signal in 1..SIGNALS {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                to_default(signal);
            }
        }
        // Its own process group, so the whole step can be stopped at once.
        if libc::setpgid(0, 0) != 0 {
            give_up(EXEC, errno());
        }
        if let Some(mask) = plan.umask {
            libc::umask(mask);
        }
        if let Some(confinement) = plan.confinement
            && let Err(error) = confinement.apply()
        {
            give_up(CONFINE, error.raw_os_error().unwrap_or(libc::EIO));
        }
        // Confined first: the working directory must be within reach of the step.
        if let Some(workdir) = &plan.workdir
            && libc::chdir(workdir.as_ptr()) != 0
        {
            give_up(EXEC, errno());
        }
        // All three are above 2 (`above_stdio`), so no copy overwrites one still to copy.
        for (from, to) in [(plan.stdin, 0), (plan.stdout, 1), (plan.stderr, 2)] {
            if libc::dup2(from, to) == -1 {
                give_up(EXEC, errno());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // As `execvp` looks a program up: a directory where it is not found, or not a
        // directory, goes on to the next; one where it is not permitted too, but that is
        // the error if no directory has it.
        let mut denied = false;
        for program in &plan.programs {
            libc::execve(program.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
            match errno() {
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                libc::EACCES => denied = true,
                other => give_up(EXEC, other),
            }
        }
        give_up(EXEC, if denied { libc::EACCES } else { libc::ENOENT })
    }
}

/// Sets `signal`'s action to its default, with the system call itself: glibc's
/// `sigaction` refuses the two signals it keeps for itself, which a process that glibc's
/// `posix_spawn` started inherits as ignored.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
unsafe fn to_default(signal: libc::c_int) {
    /// The kernel's `struct sigaction` on these architectures.
    #[repr(C)]
    struct KernelAction {
        handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let default = KernelAction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: the kernel reads `default` and writes nothing (no old action asked for).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            signal,
            &default as *const KernelAction,
            std::ptr::null_mut::<KernelAction>(),
            std::mem::size_of::<u64>(),
        )
    };
}

/// Sets `signal`'s action to its default (glibc keeps its own two signals as they are).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn to_default(signal: libc::c_int) {
    // SAFETY: a zeroed sigaction with SIG_DFL is a valid argument.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &default, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment(path: &str) -> BTreeMap<OsString, OsString> {
        BTreeMap::from([
            ("PATH".into(), path.into()),
            ("GREETING".into(), "hello".into()),
        ])
    }

    fn output(step: &mut Step) -> (String, String) {
        use std::io::Read;
        let read = |fd: Option<OwnedFd>| {
            let mut text = String::new();
            std::fs::File::from(fd.expect("pipe"))
                .read_to_string(&mut text)
                .expect("read");
            text
        };
        (read(step.stdout.take()), read(step.stderr.take()))
    }

    #[test]
    fn a_step_runs_in_its_own_group_with_its_environment_directory_and_umask() {
        let dir = tempfile::tempdir().expect("dir");
        let env = environment("/usr/bin:/bin");
        let argv: Vec<String> = [
            "sh",
            "-c",
            "echo \"$GREETING $(pwd) $(umask)\"; cut -d' ' -f5 /proc/$$/stat; echo $$; \
             echo alive >&2; exit 3",
        ]
        .map(String::from)
        .to_vec();
        let mut step = start(&Request {
            argv: &argv,
            env: &env,
            workdir: Some(dir.path()),
            umask: Some(rustix::fs::Mode::from_bits_truncate(0o027)),
            confinement: None,
        })
        .unwrap_or_else(|_| panic!("started"));
        assert!(step.pidfd.is_some(), "a pidfd from the clone");
        let (out, err) = output(&mut step);
        let status = step.wait().expect("wait");
        assert_eq!(status.code(), Some(3));
        assert_eq!(
            step.try_wait().expect("again"),
            Some(status),
            "once reaped, its status is kept (its pid may be another's by now)"
        );
        let lines: Vec<&str> = out.lines().collect();
        let cwd = dir.path().canonicalize().expect("canonical");
        assert_eq!(lines[0], format!("hello {} 0027", cwd.display()));
        assert_eq!(lines[1], lines[2], "its own process group: {out}");
        assert_eq!(lines[2], step.pid().to_string());
        assert_eq!(err, "alive\n");
    }

    #[test]
    fn the_step_starts_with_no_signal_ignored_or_blocked() {
        let env = environment("/usr/bin:/bin");
        // SIGPIPE ignored (as the Rust runtime does) and SIGUSR1 blocked in this thread
        // must not reach the step.
        // SAFETY: plain signal disposition and mask changes; the mask is restored below.
        let old = unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            let mut usr1: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut usr1);
            libc::sigaddset(&mut usr1, libc::SIGUSR1);
            libc::pthread_sigmask(libc::SIG_BLOCK, &usr1, &mut old);
            old
        };
        let argv: Vec<String> = ["sh", "-c", "exec grep -E '^Sig(Ign|Blk)' /proc/self/status"]
            .map(String::from)
            .to_vec();
        let started = start(&Request {
            argv: &argv,
            env: &env,
            workdir: None,
            umask: None,
            confinement: None,
        });
        // SAFETY: restores this thread's mask.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        let mut step = started.unwrap_or_else(|_| panic!("started"));
        let (out, _) = output(&mut step);
        step.wait().expect("wait");
        // Read by the program the shell executes in its place (a shell blocks signals
        // of its own while it waits for a child).
        assert!(
            out.contains("SigBlk:\t0000000000000000"),
            "nothing blocked: {out}"
        );
        assert!(
            out.contains("SigIgn:\t0000000000000000"),
            "nothing ignored: {out}"
        );
    }

    #[test]
    fn what_cannot_start_says_why_and_leaves_no_child() {
        let env = environment("/nonexistent:/usr/bin:/bin");
        let run = |argv: &[&str], workdir: Option<&Path>| {
            let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
            match start(&Request {
                argv: &argv,
                env: &env,
                workdir,
                umask: None,
                confinement: None,
            }) {
                Ok(_) => panic!("{argv:?} started"),
                Err(Failure::Exec(error)) => error,
                Err(Failure::Confine(error)) => panic!("confinement: {error}"),
            }
        };
        assert_eq!(
            run(&["no-such-program-anywhere"], None).raw_os_error(),
            Some(libc::ENOENT)
        );
        let plain = tempfile::NamedTempFile::new().expect("a file");
        let plain = plain.path().to_str().expect("UTF-8");
        assert_eq!(run(&[plain], None).raw_os_error(), Some(libc::EACCES));
        assert_eq!(
            run(&["true"], Some(Path::new("/nonexistent-dir"))).raw_os_error(),
            Some(libc::ENOENT)
        );
        assert_eq!(run(&["tr\0ue"], None).kind(), io::ErrorKind::InvalidInput);
        // Every child that failed was reaped (this thread's children: tests run beside
        // each other in one process).
        let left = std::fs::read_to_string("/proc/thread-self/children").expect("children");
        assert_eq!(left.trim(), "", "children left");
        // Not permitted in one directory of PATH and found in none: not permitted, as
        // `execvp` says it.
        let denied = tempfile::tempdir().expect("dir");
        std::fs::write(denied.path().join("tool"), "#!/bin/sh\n").expect("tool");
        let path = format!("{}:/nonexistent", denied.path().display());
        let env_denied = environment(&path);
        let argv = vec!["tool".to_string()];
        let Err(Failure::Exec(error)) = start(&Request {
            argv: &argv,
            env: &env_denied,
            workdir: None,
            umask: None,
            confinement: None,
        }) else {
            panic!("a file without execute permission started");
        };
        assert_eq!(error.raw_os_error(), Some(libc::EACCES));
        // Found through PATH past a directory that does not exist.
        let argv = vec!["true".to_string()];
        let mut step = start(&Request {
            argv: &argv,
            env: &env,
            workdir: None,
            umask: None,
            confinement: None,
        })
        .unwrap_or_else(|_| panic!("true started"));
        assert!(step.wait().expect("wait").success());
    }
}
