//! Real processes for tests: a child killed by PID when dropped, and one started and waited for
//! until it listens. The binary's path comes from the caller (`env!("CARGO_BIN_EXE_sluice")` is
//! only known to the binary crate's own tests).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a process may take to start listening before the test fails.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A child process, killed by its PID and reaped when dropped, so a failing test leaves nothing
/// running.
#[derive(Debug)]
pub struct Spawned(pub Child);

impl Spawned {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `program ARGS...` quietly (`SLUICE_LOG=warn`, output discarded) and waits until
/// `addr` accepts connections. Panics, naming the command, if it exits or never listens.
pub fn spawn_listening(program: impl AsRef<Path>, args: &[&str], addr: &str) -> Spawned {
    let mut command = Command::new(program.as_ref());
    command
        .args(args)
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    spawn_command_listening(command, addr)
}

/// Starts `command` as it is configured and waits until `addr` accepts connections.
pub fn spawn_command_listening(mut command: Command, addr: &str) -> Spawned {
    let what = format!("{command:?}");
    let mut spawned = Spawned(command.spawn().unwrap_or_else(|e| panic!("{what}: {e}")));
    let deadline = Instant::now() + START_TIMEOUT;
    while std::net::TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = spawned.0.try_wait() {
            panic!("{what} exited with {status} before listening on {addr}");
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on {addr} within {START_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    spawned
}

/// A loopback address that was free a moment ago, as `127.0.0.1:PORT`.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", crate::free_port())
}
