//! The supervisor zygote: `scarab supervise --zygote`, started once by the service, forks
//! a supervisor for each local attempt.
//!
//! Executing this binary for every step cost more CPU than anything else a step does (the
//! dynamic loader's relocations, libc's start-up, the first page faults of a large
//! binary): the zygote pays that once. It holds one thread and nothing of the service (it
//! was started with the supervisor's clean environment, like any supervisor), so a fork
//! of it is a supervisor exactly as `scarab supervise DIR` would be, only cheaper.
//!
//! The protocol is a `SOCK_SEQPACKET` socket pair; the zygote's end is its stdin. The
//! service sends one request per attempt — the attempt directory and the protected paths,
//! with the read end of the launch handshake pipe as `SCM_RIGHTS` — and the zygote answers
//! with a pidfd of the forked supervisor, which the service watches for its exit. The
//! handshake's write end never leaves the service, so a supervisor still sees end of file
//! when the service dies, as before. The zygote exits when the service's end closes; the
//! supervisors it forked go on (they are in their own sessions, reparented to init).
//!
//! Anything that goes wrong with the zygote falls back to executing the binary, so a
//! zygote killed by an operator, or one of another version after an upgrade, costs speed
//! only.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Pid, PidfdFlags};

/// The first bytes of every request. A zygote of another version refuses a request it
/// does not know, and the service then executes the binary instead.
const PROTOCOL: &[u8] = b"scarab-zygote/2\0";

/// The arguments a zygote is started with (`scarab supervise --zygote`). The command line
/// recognises them before its parser runs, so the zygote never builds the parser.
pub const ARGS: [&str; 2] = ["supervise", "--zygote"];

/// The most a request may hold: an attempt directory and the protected paths.
const MAX_MESSAGE: usize = 64 * 1024;

/// The most an answer may hold: "ok", or why no supervisor was forked.
const MAX_ANSWER: usize = 4 * 1024;

/// How long the service waits for an answer before it gives up on the zygote.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The service's side: a running zygote.
pub struct Zygote {
    socket: tokio::io::unix::AsyncFd<OwnedFd>,
    /// Kept so the zygote is reaped (by tokio) once it exits.
    _process: tokio::process::Child,
}

impl Zygote {
    /// Starts `command` (`scarab supervise --zygote`, with the supervisors' environment)
    /// with its end of a new socket pair as stdin.
    pub fn start(mut command: tokio::process::Command) -> io::Result<Zygote> {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        let process = command
            .stdin(std::process::Stdio::from(theirs))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(false)
            .spawn()?;
        let interest = tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE;
        // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and refers to
        // the same socket for the AsyncFd's whole life.
        let socket = unsafe { tokio::io::unix::AsyncFd::register_with_interest(ours, interest) }
            .map_err(|refused| refused.into_parts().1)?;
        Ok(Zygote {
            socket,
            _process: process,
        })
    }

    /// Forks a supervisor for the attempt in `dir`. `go` is the read end of its launch
    /// handshake pipe (its stdin). Returns a pidfd of the supervisor.
    pub async fn fork(&self, dir: &Path, protected: &str, go: OwnedFd) -> Result<OwnedFd, Failed> {
        self.request(dir, protected, go)
            .await
            .map_err(Failed::Broken)?
    }

    /// The exchange itself: an error is the zygote's (it is no longer usable), an inner
    /// error its answer (it refused this one request and serves the next).
    async fn request(
        &self,
        dir: &Path,
        protected: &str,
        go: OwnedFd,
    ) -> io::Result<Result<OwnedFd, Failed>> {
        let mut request = PROTOCOL.to_vec();
        request.extend_from_slice(dir.as_os_str().as_encoded_bytes());
        request.push(0);
        request.extend_from_slice(protected.as_bytes());
        if request.len() > MAX_MESSAGE {
            return Ok(Err(Failed::Refused(
                "the request is larger than the zygote takes".into(),
            )));
        }
        let sent = self
            .socket
            .async_io(tokio::io::Interest::WRITABLE, |socket| {
                Ok(send_message(socket, &request, Some(go.as_fd()))?)
            });
        tokio::time::timeout(ANSWER_TIMEOUT, sent)
            .await
            .map_err(|_| io::Error::other("the zygote took no request"))??;
        drop(go);
        let answer = self
            .socket
            .async_io(tokio::io::Interest::READABLE, |socket| {
                let mut bytes = vec![0; MAX_ANSWER];
                let (length, fds) = receive(socket, &mut bytes)?;
                bytes.truncate(length);
                Ok((bytes, fds))
            });
        let (bytes, mut fds) = tokio::time::timeout(ANSWER_TIMEOUT, answer)
            .await
            .map_err(|_| io::Error::other("the zygote did not answer"))??;
        match (bytes.as_slice(), fds.pop()) {
            (b"ok", Some(pidfd)) if fds.is_empty() => Ok(Ok(pidfd)),
            ([], None) => Err(io::Error::other("the zygote is gone")),
            (text, _) => Ok(Err(Failed::Refused(
                String::from_utf8_lossy(text).into_owned(),
            ))),
        }
    }
}

/// Why the zygote forked no supervisor.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    /// No supervisor for this request (the zygote refused it and says why, or the
    /// request could not be made); the zygote serves the next.
    #[error("the zygote could not fork a supervisor: {0}")]
    Refused(String),
    /// It is gone or does not answer: it must be replaced.
    #[error("the zygote failed: {0}")]
    Broken(io::Error),
}

/// One message into `buffer` (its length, and the descriptors that came with it).
/// Truncated messages are errors.
///
/// The buffer is the caller's to keep: in the zygote a fresh one per request would be
/// written over in full, and after each fork every page written is copied.
fn receive(socket: impl AsFd, buffer: &mut [u8]) -> rustix::io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let message = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(buffer)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for part in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = part {
            fds.extend(received);
        }
    }
    if message
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
    {
        return Err(rustix::io::Errno::MSGSIZE);
    }
    Ok((message.bytes, fds))
}

/// One supervisor the zygote forked: its pid and the zygote's end of the socket pair it
/// is given attempts on.
struct Supervisor {
    pid: Pid,
    channel: OwnedFd,
    /// When it last became free.
    since: Instant,
}

/// What a supervisor tells the zygote when it is done with an attempt and takes another.
const FREE: &[u8] = b"free";

/// The zygote: serves the service on `socket` (its stdin) until the service's end closes.
///
/// It must stay single-threaded: a fork copies only the calling thread, and the child
/// goes on to run a whole supervisor.
///
/// Supervisors are kept: one that ends an attempt cleanly (`supervisor::Ending::Clean`)
/// says so and waits for the next, so the fork, the first page faults and the exit of a
/// process are paid once for many attempts. A free supervisor is given the next attempt
/// (the most recently freed first: its pages are the warmest); at most
/// `limits::SUPERVISORS_KEPT_FREE` wait, each for at most `limits::SUPERVISOR_KEPT_FOR`,
/// and each serves at most `limits::SUPERVISOR_ATTEMPTS_MAX` attempts.
pub fn serve(socket: OwnedFd) -> io::Result<()> {
    // Out of the service's session: a terminal's ^C stops the service, which closes the
    // socket, and the zygote then ends on its own.
    let _ = rustix::process::setsid();
    rustix::io::ioctl_fionbio(&socket, false)?;
    // Building a step's Landlock ruleset is the largest cost of a supervisor: the zygote
    // keeps the last one while nothing it was built from changed (see `confine::Kept`),
    // and every supervisor inherits it at its fork and keeps its own copy the same way.
    let mut kept = super::confine::Kept::default();
    let mut buffer = vec![0; MAX_MESSAGE];
    let mut free: Vec<Supervisor> = Vec::new();
    let mut busy: Vec<Supervisor> = Vec::new();
    loop {
        reap_supervisors();
        // Free supervisors that waited too long end (their socket closes).
        free.retain(|s| s.since.elapsed() < crate::limits::SUPERVISOR_KEPT_FOR);
        let (request_ready, freed, gone) = {
            // Woken at least once a second to reap the supervisors that ended meanwhile.
            let mut ready = vec![PollFd::new(&socket, PollFlags::IN)];
            ready.extend(busy.iter().map(|s| PollFd::new(&s.channel, PollFlags::IN)));
            ready.extend(free.iter().map(|s| PollFd::new(&s.channel, PollFlags::IN)));
            let second = Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            match rustix::event::poll(&mut ready, Some(&second)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(error) => return Err(error.into()),
            }
            let seen: Vec<bool> = ready.iter().map(|r| !r.revents().is_empty()).collect();
            let freed: Vec<bool> = seen[1..1 + busy.len()].to_vec();
            // A free supervisor's socket is readable only once it is gone.
            let gone: Vec<bool> = seen[1 + busy.len()..].to_vec();
            (seen[0], freed, gone)
        };
        free = free
            .into_iter()
            .zip(gone)
            .filter_map(|(supervisor, gone)| (!gone).then_some(supervisor))
            .collect();
        let mut still_busy = Vec::with_capacity(busy.len());
        for (supervisor, readable) in busy.drain(..).zip(freed) {
            if !readable {
                still_busy.push(supervisor);
                continue;
            }
            let mut said = [0u8; 16];
            match receive(&supervisor.channel, &mut said) {
                Ok((length, _))
                    if &said[..length] == FREE
                        && free.len() < crate::limits::SUPERVISORS_KEPT_FREE =>
                {
                    free.push(Supervisor {
                        since: Instant::now(),
                        ..supervisor
                    });
                }
                // Gone, or one too many to keep: dropped, its socket closes and it ends.
                _ => {}
            }
        }
        busy = still_busy;
        if !request_ready {
            continue;
        }
        let (request, mut fds) = match receive(&socket, &mut buffer) {
            Ok((length, fds)) => (&buffer[..length], fds),
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
            Err(rustix::io::Errno::MSGSIZE) => {
                answer(&socket, b"request too large", None)?;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        if request.is_empty() && fds.is_empty() {
            // The service closed its end.
            return Ok(());
        }
        let go = fds.pop().filter(|_| fds.is_empty());
        drop(fds);
        let handed = match (parse(request), go) {
            (Ok((dir, protected)), Some(go)) => hand_over(
                request, &dir, &protected, go, &mut free, &busy, &socket, &mut kept,
            ),
            (Err(error), _) => Err(error),
            (Ok(_), None) => Err(io::Error::other(
                "a request needs exactly one descriptor: the handshake",
            )),
        };
        match handed {
            Ok(supervisor) => {
                let pid = supervisor.pid;
                busy.push(supervisor);
                // The supervisor cannot have been reaped yet (only this process reaps, and
                // it tracks it as busy), so the pid is still that process's.
                match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
                    Ok(pidfd) => answer(&socket, b"ok", Some(pidfd))?,
                    Err(error) => answer(&socket, error.to_string().as_bytes(), None)?,
                }
            }
            Err(error) => answer(&socket, error.to_string().as_bytes(), None)?,
        }
    }
}

/// Gives the attempt of `request` to a free supervisor, or to a new one forked for it.
#[allow(clippy::too_many_arguments)]
fn hand_over(
    request: &[u8],
    dir: &Path,
    protected: &str,
    go: OwnedFd,
    free: &mut Vec<Supervisor>,
    busy: &[Supervisor],
    socket: &OwnedFd,
    kept: &mut super::confine::Kept,
) -> io::Result<Supervisor> {
    while let Some(supervisor) = free.pop() {
        // One that died since it said it was free fails here (its socket is closed):
        // the next is tried.
        if send(&supervisor.channel, request, &go).is_ok() {
            return Ok(supervisor);
        }
    }
    // Built (or checked) before the fork, so the new supervisor inherits it.
    let _ = super::supervisor::protected_paths(dir, Some(protected))
        .and_then(|paths| kept.confinement(&paths));
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    // What the child must not hold: the service's socket, every other supervisor's
    // socket, this attempt's handshake (it arrives again, over its own socket).
    let mut foreign: Vec<i32> = vec![ours.as_raw_fd(), go.as_raw_fd()];
    foreign.extend(free.iter().chain(busy).map(|s| s.channel.as_raw_fd()));
    // SAFETY: this process has a single thread (see `serve`), so the child is a complete
    // copy of it and may go on running any code.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        std::process::exit(supervisor_process(socket, &foreign, theirs, kept));
    }
    drop(theirs);
    let pid = Pid::from_raw(pid).ok_or_else(io::Error::last_os_error)?;
    let supervisor = Supervisor {
        pid,
        channel: ours,
        since: Instant::now(),
    };
    send(&supervisor.channel, request, &go)?;
    Ok(supervisor)
}

/// One message, with at most one descriptor (`SCM_RIGHTS`): the counterpart of
/// `receive`, for the service's requests, the zygote's answers and the attempts it hands
/// to supervisors.
fn send_message(
    socket: impl AsFd,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> rustix::io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fd.is_some() {
        control.push(SendAncillaryMessage::ScmRights(fd.as_slice()));
    }
    rustix::net::sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
}

/// Sends `request` with the handshake `go` to a supervisor.
fn send(channel: &OwnedFd, request: &[u8], go: &OwnedFd) -> io::Result<()> {
    send_message(channel, request, Some(go.as_fd()))?;
    Ok(())
}

fn answer(socket: &OwnedFd, text: &[u8], pidfd: Option<OwnedFd>) -> io::Result<()> {
    let text = &text[..text.len().min(MAX_ANSWER)];
    send_message(socket, text, pidfd.as_ref().map(AsFd::as_fd))?;
    Ok(())
}

/// A request's attempt directory and protected paths (as `confine::PROTECT_VAR` holds
/// them).
fn parse(request: &[u8]) -> io::Result<(PathBuf, String)> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let body = request
        .strip_prefix(PROTOCOL)
        .ok_or_else(|| invalid("not a request of this zygote's protocol"))?;
    let split = body
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| invalid("a request is a directory and the protected paths"))?;
    let dir = PathBuf::from(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&body[..split]),
    );
    if !dir.is_absolute() {
        return Err(invalid("the attempt directory must be absolute"));
    }
    let protected = String::from_utf8(body[split + 1..].to_vec())
        .map_err(|_| invalid("the protected paths are not UTF-8"))?;
    Ok((dir, protected))
}

/// The forked child: a supervisor that takes attempts from `channel` until the zygote is
/// gone, an attempt does not end cleanly, or it served its share. Returns its exit code.
fn supervisor_process(
    zygote_socket: &OwnedFd,
    foreign: &[i32],
    channel: OwnedFd,
    kept: &mut super::confine::Kept,
) -> i32 {
    // Stdin (the zygote's socket to the service) becomes /dev/null, and the other
    // descriptors of the zygote close: a supervisor holds nothing of the zygote but its
    // own socket.
    let Ok(null) = std::fs::File::open("/dev/null") else {
        return 1;
    };
    // SAFETY: plain descriptor numbers, all open in this process; none is used again.
    unsafe {
        if libc::dup2(null.as_raw_fd(), zygote_socket.as_raw_fd()) < 0 {
            return 1;
        }
        for fd in foreign {
            libc::close(*fd);
        }
    }
    drop(null);
    let mut kept = std::mem::take(kept);
    let mut buffer = vec![0; MAX_MESSAGE];
    for _ in 0..crate::limits::SUPERVISOR_ATTEMPTS_MAX {
        let (length, mut fds) = loop {
            match receive(&channel, &mut buffer) {
                Err(rustix::io::Errno::INTR) => continue,
                Ok(received) => break received,
                Err(_) => return 1,
            }
        };
        if length == 0 && fds.is_empty() {
            // The zygote is gone.
            return 0;
        }
        let go = fds.pop().filter(|_| fds.is_empty());
        drop(fds);
        let (Ok((dir, protected)), Some(go)) = (parse(&buffer[..length]), go) else {
            return 1;
        };
        let confinement = super::supervisor::protected_paths(&dir, Some(&protected))
            .and_then(|paths| kept.confinement(&paths));
        match super::supervisor::supervise_confined(&dir, Some(confinement), go) {
            Ok(super::supervisor::Ending::Clean) => {}
            Ok(super::supervisor::Ending::Exit) => return 0,
            Err(_) => return 1,
        }
        if rustix::net::send(&channel, FREE, SendFlags::NOSIGNAL).is_err() {
            return 0;
        }
    }
    0
}

/// Reaps every supervisor that has ended. The service watches them through pidfds, which
/// stay valid after the reaping.
fn reap_supervisors() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid pointer to an int.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_before_anything_forks() {
        let request = |body: &[u8]| {
            let mut bytes = PROTOCOL.to_vec();
            bytes.extend_from_slice(body);
            bytes
        };
        let (dir, protected) = parse(&request(b"/state/attempts/7\0[]")).expect("valid");
        assert_eq!(dir, Path::new("/state/attempts/7"));
        assert_eq!(protected, "[]");
        assert!(
            parse(b"scarab-zygote/0\0/a\0[]").is_err(),
            "another version"
        );
        assert!(parse(&request(b"relative/7\0[]")).is_err());
        assert!(parse(&request(b"/no/separator")).is_err());
        assert!(parse(&request(b"/a\0\xff")).is_err());
    }
}
