//! The x_tables socket options on a raw IP socket, and the `/run/xtables.lock`
//! file lock. All `unsafe` of the xtables module is here.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use super::codec::{
    COUNTERS_LEN, Counters, Emitted, Family, IPT_SO_GET_ENTRIES, IPT_SO_GET_INFO,
    IPT_SO_SET_ADD_COUNTERS, IPT_SO_SET_REPLACE, parse_counters, replace_request,
};

/// `-1` from a libc call becomes the thread's `errno`.
fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A raw socket of one family (`AF_INET`/`AF_INET6`, `SOCK_RAW`, `IPPROTO_RAW`),
/// as iptables-legacy opens, used only for its `SOL_IP`/`SOL_IPV6` options. It
/// talks to the tables of the network namespace it was opened in.
#[derive(Debug)]
pub(crate) struct XtSocket {
    fd: OwnedFd,
    level: libc::c_int,
}

impl XtSocket {
    pub(crate) fn open(family: Family) -> io::Result<XtSocket> {
        let (af, level) = match family {
            Family::Ipv4 => (libc::AF_INET, libc::SOL_IP),
            Family::Ipv6 => (libc::AF_INET6, libc::SOL_IPV6),
        };
        // SAFETY: socket(2) takes no pointers.
        let fd = cvt(unsafe {
            libc::socket(af, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW)
        })?;
        // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(XtSocket { fd, level })
    }

    /// getsockopt(2) into `buf`; the kernel reads the request from it too.
    fn get(&self, opt: libc::c_int, buf: &mut [u8]) -> io::Result<usize> {
        let mut len = buf.len() as libc::socklen_t;
        // SAFETY: `buf` is valid for reads and writes of `len` bytes for the whole
        // call, `len` is a live socklen_t, and the fd is open (owned by `self`).
        cvt(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                self.level,
                opt,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        })?;
        Ok(len as usize)
    }

    /// setsockopt(2) with `buf`.
    fn set(&self, opt: libc::c_int, buf: &[u8]) -> io::Result<()> {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the whole call
        // and the fd is open (owned by `self`).
        cvt(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                self.level,
                opt,
                buf.as_ptr().cast(),
                buf.len() as libc::socklen_t,
            )
        })?;
        Ok(())
    }

    /// `IPT_SO_GET_INFO`: `buf` is the request (`TableInfo::request`), the reply
    /// replaces it.
    pub(crate) fn get_info(&self, buf: &mut [u8]) -> io::Result<()> {
        self.get(IPT_SO_GET_INFO, buf).map(drop)
    }

    /// `IPT_SO_GET_ENTRIES`: `buf` is `get_entries_request`; the kernel fills in
    /// the entries (`EAGAIN` if the table's size is no longer the requested one).
    pub(crate) fn get_entries(&self, buf: &mut [u8]) -> io::Result<()> {
        self.get(IPT_SO_GET_ENTRIES, buf).map(drop)
    }

    /// `IPT_SO_SET_REPLACE`; returns the final counters of the `num_counters`
    /// replaced entries, which the kernel writes to a buffer we pass by address.
    pub(crate) fn replace(
        &self,
        name: &str,
        valid_hooks: u32,
        layout: &Emitted,
        num_counters: u32,
    ) -> io::Result<Vec<Counters>> {
        let mut old = vec![0u8; COUNTERS_LEN * num_counters as usize];
        let req = replace_request(
            name,
            valid_hooks,
            layout,
            num_counters,
            old.as_mut_ptr() as u64,
        )
        .map_err(io::Error::other)?;
        // The kernel writes `num_counters` counters through the pointer inside
        // `req`: `old` has exactly that size and outlives the call below.
        self.set(IPT_SO_SET_REPLACE, &req)?;
        Ok(parse_counters(&old))
    }

    /// `IPT_SO_SET_ADD_COUNTERS` with `add_counters_request` bytes.
    pub(crate) fn add_counters(&self, buf: &[u8]) -> io::Result<()> {
        self.set(IPT_SO_SET_ADD_COUNTERS, buf)
    }
}

/// `XT_LOCK_NAME`: the file iptables (`-w`) and kube-proxy lock around changes.
pub const XT_LOCK_PATH: &str = "/run/xtables.lock";

/// An exclusive `flock` on [`XT_LOCK_PATH`], released on drop.
#[derive(Debug)]
pub(crate) struct XtLock {
    _file: File,
}

impl XtLock {
    /// Waits up to `timeout` for the lock. `Ok(None)` when the lock file cannot
    /// be opened (no writable `/run`): the caller goes on without it, relying on
    /// the kernel's `EAGAIN` check alone.
    pub(crate) fn acquire(timeout: Duration) -> io::Result<Option<XtLock>> {
        let file = match OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(XT_LOCK_PATH)
        {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("cannot open {XT_LOCK_PATH}, going on without it: {e}");
                return Ok(None);
            }
        };
        let start = Instant::now();
        loop {
            // SAFETY: flock(2) on an fd owned by `file`, no pointers.
            match cvt(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) {
                Ok(_) => return Ok(Some(XtLock { _file: file })),
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    if start.elapsed() >= timeout {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}
