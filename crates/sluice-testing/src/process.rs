//! Real processes for tests: a child killed by PID when dropped, and one started and waited for
//! until it listens. The binary's path comes from the caller (`env!("CARGO_BIN_EXE_sluice")` is
//! only known to the binary crate's own tests).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Child, Command};
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

/// Starts `program ARGS...` quietly (`SLUICE_LOG=warn`) and waits until `addr` accepts
/// connections. Panics, naming the command and quoting what it printed, if it exits or never
/// listens.
pub fn spawn_listening(program: impl AsRef<Path>, args: &[&str], addr: &str) -> Spawned {
    let mut command = Command::new(program.as_ref());
    command.args(args).env("SLUICE_LOG", "warn");
    spawn_captured_listening(command, addr)
}

/// Starts `command` with its stdout and stderr kept in an anonymous file, and waits until `addr`
/// accepts connections. If it exits or never listens, the panic quotes the end of its output.
pub fn spawn_captured_listening(mut command: Command, addr: &str) -> Spawned {
    let output = tempfile::tempfile().expect("an anonymous file for the output");
    let copy = || output.try_clone().expect("a second handle on the output");
    command.stdout(copy()).stderr(copy());
    wait_listening(command, addr, Some(output))
}

/// Starts `command` as it is configured (its output goes where the caller sent it) and waits
/// until `addr` accepts connections.
pub fn spawn_command_listening(command: Command, addr: &str) -> Spawned {
    wait_listening(command, addr, None)
}

fn wait_listening(mut command: Command, addr: &str, output: Option<File>) -> Spawned {
    let what = format!("{command:?}");
    let mut spawned = Spawned(command.spawn().unwrap_or_else(|e| panic!("{what}: {e}")));
    let printed = |output: Option<File>| output.map(tail).unwrap_or_default();
    let deadline = Instant::now() + START_TIMEOUT;
    while std::net::TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = spawned.0.try_wait() {
            panic!(
                "{what} exited with {status} before listening on {addr}{}",
                printed(output)
            );
        }
        if Instant::now() >= deadline {
            panic!(
                "{what} did not listen on {addr} within {START_TIMEOUT:?}{}",
                printed(output)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    spawned
}

/// The last few kilobytes a process wrote to `output`, as a paragraph for a panic message.
fn tail(mut output: File) -> String {
    const TAIL: u64 = 4_096;
    let len = output.seek(SeekFrom::End(0)).unwrap_or(0);
    let mut text = Vec::new();
    let read = output
        .seek(SeekFrom::Start(len.saturating_sub(TAIL)))
        .and_then(|_| output.read_to_end(&mut text));
    match read {
        Ok(0) => "; it printed nothing".to_owned(),
        Ok(_) => format!(
            "; it printed (last {TAIL} bytes):\n{}",
            String::from_utf8_lossy(&text)
        ),
        Err(e) => format!("; its output could not be read: {e}"),
    }
}

/// A loopback address that was free a moment ago, as `127.0.0.1:PORT`.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", crate::free_port())
}
