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
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Pid, PidfdFlags};

/// The first bytes of every request. A zygote of another version refuses a request it
/// does not know, and the service then executes the binary instead.
const PROTOCOL: &[u8] = b"scarab-zygote/1\0";

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
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                let fds = [go.as_fd()];
                control.push(SendAncillaryMessage::ScmRights(&fds));
                let iov = [IoSlice::new(&request)];
                Ok(rustix::net::sendmsg(
                    socket,
                    &iov,
                    &mut control,
                    SendFlags::NOSIGNAL,
                )?)
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

/// The zygote: serves the service on `socket` (its stdin) until the service's end closes.
///
/// It must stay single-threaded: a fork copies only the calling thread, and the child
/// goes on to run a whole supervisor.
pub fn serve(socket: OwnedFd) -> io::Result<()> {
    // Out of the service's session: a terminal's ^C stops the service, which closes the
    // socket, and the zygote then ends on its own.
    let _ = rustix::process::setsid();
    rustix::io::ioctl_fionbio(&socket, false)?;
    // Building a step's Landlock ruleset is the largest cost of a supervisor: the zygote
    // keeps the last one while nothing it was built from changed (see `confine::Kept`).
    let mut kept = super::confine::Kept::default();
    let mut buffer = vec![0; MAX_MESSAGE];
    loop {
        reap_supervisors();
        // Woken at least once a second to reap the supervisors that ended meanwhile.
        let mut ready = [PollFd::new(&socket, PollFlags::IN)];
        let second = Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut ready, Some(&second)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(error) => return Err(error.into()),
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
        let forked = match (parse(request), go) {
            (Ok((dir, protected)), Some(go)) => {
                let confinement = super::supervisor::protected_paths(&dir, Some(&protected))
                    .and_then(|paths| kept.confinement(&paths));
                fork_supervisor(&dir, confinement, go)
            }
            (Err(error), _) => Err(error),
            (Ok(_), None) => Err(io::Error::other(
                "a request needs exactly one descriptor: the handshake pipe",
            )),
        };
        match forked {
            Ok(pidfd) => answer(&socket, b"ok", Some(pidfd))?,
            Err(error) => answer(&socket, error.to_string().as_bytes(), None)?,
        }
    }
}

fn answer(socket: &OwnedFd, text: &[u8], pidfd: Option<OwnedFd>) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds: Vec<_> = pidfd.iter().map(AsFd::as_fd).collect();
    if !fds.is_empty() {
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    let text = &text[..text.len().min(MAX_ANSWER)];
    rustix::net::sendmsg(
        socket,
        &[IoSlice::new(text)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
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

/// Forks a supervisor for `dir` with `go` as its stdin; returns a pidfd of it.
fn fork_supervisor(dir: &Path, confinement: Confined, go: OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: this process has a single thread (see `serve`), so the child is a complete
    // copy of it and may go on running any code.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        std::process::exit(supervise_forked(dir, confinement, go));
    }
    drop(go);
    drop(confinement);
    let pid = Pid::from_raw(pid).ok_or_else(io::Error::last_os_error)?;
    // The child cannot have been reaped yet (only this process reaps it), so the pid is
    // still that child's even if it already exited.
    Ok(rustix::process::pidfd_open(pid, PidfdFlags::empty())?)
}

/// The step's confinement as the zygote built it (or why it could not).
type Confined = Result<super::confine::Confinement, super::confine::ConfineError>;

/// The forked child: becomes the supervisor of `dir`. Returns its exit code.
fn supervise_forked(dir: &Path, confinement: Confined, go: OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    // Stdin becomes the handshake pipe, replacing the zygote's socket: a supervisor holds
    // nothing of the zygote.
    // SAFETY: plain descriptor numbers; `go` stays open across the call.
    if unsafe { libc::dup2(go.as_raw_fd(), libc::STDIN_FILENO) } < 0 {
        return 1;
    }
    drop(go);
    match super::supervisor::supervise_confined(dir, Some(confinement)) {
        Ok(()) => 0,
        Err(_) => 1,
    }
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
