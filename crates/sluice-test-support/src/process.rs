//! Real processes for tests: a child killed by PID when dropped or stopped with SIGTERM, and one
//! started and waited for until it listens. The binary's path comes from the caller
//! (`env!("CARGO_BIN_EXE_sluice")` is only known to the binary crate's own tests).

use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use crate::wait::{PATIENCE, wait_within};

/// How long a process may take to start listening before the test fails: longer than
/// [`PATIENCE`], as a debug binary starting while other tests build and run can be slow.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A child process, killed by its PID and reaped when dropped, so a failing test leaves nothing
/// running.
#[derive(Debug)]
pub struct Spawned(pub Child);

impl Spawned {
    /// Starts `command` as it is configured; panics naming it if it cannot start.
    pub fn spawn(command: &mut Command) -> Self {
        match command.spawn() {
            Ok(child) => Spawned(child),
            Err(e) => panic!("{command:?}: {e}"),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Sends SIGTERM, as an orchestrator stops a process, and waits at most [`PATIENCE`] for it
    /// to exit. The exit status is the caller's to judge.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.pid().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(
            sent.as_ref().is_ok_and(ExitStatus::success),
            "kill -TERM {pid}: {sent:?}"
        );
        wait_within("the process exits after SIGTERM", PATIENCE, || {
            self.0.try_wait().expect("the process's status")
        })
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

/// Starts `command` and waits until `addr` accepts connections; `output` is where its output
/// went, if the caller kept it, to quote when it fails.
pub(crate) fn wait_listening(mut command: Command, addr: &str, output: Option<File>) -> Spawned {
    let what = format!("{command:?}");
    let mut spawned = Spawned::spawn(&mut command);
    let printed = Printed(output.as_ref());
    wait_within(
        &format!("{what} listens on {addr}"),
        START_TIMEOUT,
        || -> Result<(), &Printed<'_>> {
            if crate::listening(addr) {
                return Ok(());
            }
            if let Ok(Some(status)) = spawned.0.try_wait() {
                panic!("{what} exited with {status} before listening on {addr}; {printed}");
            }
            Err(&printed)
        },
    );
    spawned
}

/// What a process wrote to its output file: read only when a message quotes it.
struct Printed<'a>(Option<&'a File>);

impl fmt::Display for Printed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(output) => f.write_str(&tail(output)),
            None => f.write_str("its output went where the command sent it"),
        }
    }
}

/// The last few kilobytes a process wrote to `output`, as a paragraph for a panic message.
fn tail(output: &File) -> String {
    const TAIL: u64 = 4_096;
    let mut output = match output.try_clone() {
        Ok(handle) => handle,
        Err(e) => return format!("its output could not be read: {e}"),
    };
    let len = output.seek(SeekFrom::End(0)).unwrap_or(0);
    let mut text = Vec::new();
    let read = output
        .seek(SeekFrom::Start(len.saturating_sub(TAIL)))
        .and_then(|_| output.read_to_end(&mut text));
    match read {
        Ok(0) => "it printed nothing".to_owned(),
        Ok(_) => format!(
            "it printed (last {TAIL} bytes):\n{}",
            String::from_utf8_lossy(&text)
        ),
        Err(e) => format!("its output could not be read: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminated_process_reports_how_it_exited() {
        let _fork = crate::spawning();
        let mut sleeper = Spawned::spawn(Command::new("sleep").arg("600"));
        let status = sleeper.terminate();
        assert!(!status.success(), "{status}");
    }

    #[test]
    #[should_panic(expected = "exited with exit status: 3 before listening")]
    fn a_process_that_exits_before_listening_fails_the_wait() {
        let _fork = crate::spawning();
        let mut command = Command::new("sh");
        command.args(["-c", "echo starting; exit 3"]);
        spawn_captured_listening(command, &crate::free_addr());
    }
}
