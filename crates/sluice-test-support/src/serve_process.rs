//! [`ServeProcess`]: `sluice serve` as a real process, on free loopback addresses, waited for
//! until it listens and killed by PID when dropped. The tests of the binary, of its
//! connections and of its Redis and Envoy deployments all start it this one way.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command, ExitStatus, Stdio};

use crate::free_addr;
use crate::process::{Spawned, wait_listening};

/// A running `sluice serve` (or the binary started as `ratelimit`), with the addresses it
/// listens on. Killed by PID when dropped; [`ServeProcess::terminate`] stops it as an
/// orchestrator would.
#[derive(Debug)]
pub struct ServeProcess {
    process: Spawned,
    http: String,
    grpc: String,
}

impl ServeProcess {
    /// `program serve` on free loopback addresses (`--http-addr`, `--grpc-addr`), quiet
    /// (`SLUICE_LOG=warn`), its output kept to quote if it never listens. `program` is the
    /// binary: `env!("CARGO_BIN_EXE_sluice")` in the binary crate's tests.
    pub fn builder(program: impl AsRef<Path>) -> ServeBuilder {
        ServeBuilder {
            launcher: Vec::new(),
            program: program.as_ref().to_owned(),
            subcommand: Some("serve"),
            args: Vec::new(),
            env_clear: false,
            envs: vec![("SLUICE_LOG".into(), Some("warn".into()))],
            http: free_addr(),
            grpc: free_addr(),
            addresses: Addresses::Flags,
            ready_on: Listener::Http,
            output: Output::Captured,
        }
    }

    /// The binary under the name `ratelimit` (`program` is a link of that name), as
    /// envoyproxy/ratelimit's images start it: no subcommand, and nothing in its environment but
    /// `PATH`, its addresses as envoyproxy/ratelimit's variables, and what the test adds.
    pub fn ratelimit(program: impl AsRef<Path>) -> ServeBuilder {
        let mut builder = Self::builder(program).envoy_env();
        builder.subcommand = None;
        builder
    }

    /// Where its HTTP listener is, as `127.0.0.1:PORT`.
    pub fn http(&self) -> &str {
        &self.http
    }

    /// Where its gRPC listener is, as `127.0.0.1:PORT`.
    pub fn grpc(&self) -> &str {
        &self.grpc
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Sends SIGTERM and waits for it to exit: see [`Spawned::terminate`].
    pub fn terminate(&mut self) -> ExitStatus {
        self.process.terminate()
    }

    /// Its stdout, when the builder asked for it with [`ServeBuilder::piped_stdout`] (once).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.process.0.stdout.take()
    }
}

/// How the process learns where to listen.
#[derive(Debug, Clone, Copy)]
enum Addresses {
    /// `--http-addr` and `--grpc-addr`.
    Flags,
    /// envoyproxy/ratelimit's `HOST`, `PORT`, `GRPC_HOST` and `GRPC_PORT`.
    EnvoyEnv,
}

/// Which listener must accept connections before [`ServeBuilder::start`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The HTTP listener (the default).
    Http,
    /// The gRPC listener: for a process whose HTTP listener comes up later or not at all.
    Grpc,
}

/// Where the process's output goes.
#[derive(Debug)]
enum Output {
    /// Both streams into an anonymous file, quoted if it exits or never listens.
    Captured,
    /// Both streams into this file, for the test to read.
    File(PathBuf),
    /// Stdout to a pipe the test reads; stderr nowhere.
    PipedStdout,
}

/// How to start a [`ServeProcess`]: arguments, environment, addresses and output.
#[derive(Debug)]
#[must_use = "a builder starts nothing until `start` or `spawn`"]
pub struct ServeBuilder {
    /// A program that starts the binary (`prlimit`, say) and its arguments: empty for none.
    launcher: Vec<OsString>,
    program: PathBuf,
    subcommand: Option<&'static str>,
    args: Vec<OsString>,
    /// Whether the process inherits nothing of the test's environment but `PATH`.
    env_clear: bool,
    /// Variables set (or, with `None`, removed) after the defaults, in order.
    envs: Vec<(OsString, Option<OsString>)>,
    http: String,
    grpc: String,
    addresses: Addresses,
    ready_on: Listener,
    output: Output,
}

impl ServeBuilder {
    /// Adds one argument after the subcommand and the address flags.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments after the subcommand and the address flags.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// `--config path`: the rules it serves.
    pub fn config(self, path: impl Into<OsString>) -> Self {
        self.arg("--config").arg(path)
    }

    /// Sets an environment variable (after the defaults, so it overrides `SLUICE_LOG`).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), Some(value.into())));
        self
    }

    /// Sets environment variables, in order.
    pub fn envs<I, K, V>(self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        vars.into_iter().fold(self, |b, (k, v)| b.env(k, v))
    }

    /// Removes a variable the process would inherit from the test.
    pub fn env_remove(mut self, key: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), None));
        self
    }

    /// Runs it as envoyproxy/ratelimit is run (`serve --envoy-env`, or the binary named
    /// `ratelimit`): its addresses as `HOST`, `PORT`, `GRPC_HOST` and `GRPC_PORT` instead of
    /// flags, and nothing else of the test's environment but `PATH`, not even `SLUICE_LOG`.
    pub fn envoy_env(mut self) -> Self {
        self.addresses = Addresses::EnvoyEnv;
        self.env_clear = true;
        self.envs.clear();
        self
    }

    /// Listens for HTTP on `addr` instead of a free loopback address.
    pub fn http_addr(mut self, addr: impl Into<String>) -> Self {
        self.http = addr.into();
        self
    }

    /// Waits on `listener` instead of the HTTP one.
    pub fn ready_on(mut self, listener: Listener) -> Self {
        self.ready_on = listener;
        self
    }

    /// Writes its stdout and stderr to `path`, for the test to read.
    pub fn log_to(mut self, path: impl Into<PathBuf>) -> Self {
        self.output = Output::File(path.into());
        self
    }

    /// Pipes its stdout to the test ([`ServeProcess::take_stdout`]) and drops its stderr.
    pub fn piped_stdout(mut self) -> Self {
        self.output = Output::PipedStdout;
        self
    }

    /// Starts the binary through `program ARGS...` (`prlimit --nofile=...`, say).
    pub fn launched_by<S: Into<OsString>>(
        mut self,
        program: impl Into<OsString>,
        args: impl IntoIterator<Item = S>,
    ) -> Self {
        self.launcher = std::iter::once(program.into())
            .chain(args.into_iter().map(Into::into))
            .collect();
        self
    }

    /// The HTTP address it will listen on, for a test that must name it before the start.
    pub fn http(&self) -> &str {
        &self.http
    }

    /// The gRPC address it will listen on.
    pub fn grpc(&self) -> &str {
        &self.grpc
    }

    /// Starts it and waits until its listener ([`ServeBuilder::ready_on`]) accepts connections.
    /// Panics, naming the command and quoting what it printed when the output was kept, if it
    /// exits first or never listens.
    pub fn start(self) -> ServeProcess {
        let addr = match self.ready_on {
            Listener::Http => self.http.clone(),
            Listener::Grpc => self.grpc.clone(),
        };
        let (command, output) = self.command();
        let process = wait_listening(command, &addr, output);
        ServeProcess {
            process,
            http: self.http,
            grpc: self.grpc,
        }
    }

    /// Starts it without waiting, for a test about when it begins to listen.
    pub fn spawn(self) -> ServeProcess {
        let (mut command, _output) = self.command();
        ServeProcess {
            process: Spawned::spawn(&mut command),
            http: self.http,
            grpc: self.grpc,
        }
    }

    /// The command, and the anonymous file its output goes to when it is captured.
    fn command(&self) -> (Command, Option<std::fs::File>) {
        let mut command = match self.launcher.split_first() {
            Some((launcher, args)) => {
                let mut c = Command::new(launcher);
                c.args(args).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        command.args(self.subcommand);
        if self.env_clear {
            command.env_clear();
            if let Some(path) = std::env::var_os("PATH") {
                command.env("PATH", path);
            }
        }
        match self.addresses {
            Addresses::Flags => {
                command.args(["--http-addr", &self.http, "--grpc-addr", &self.grpc]);
            }
            Addresses::EnvoyEnv => {
                let (host, port) = split(&self.http);
                let (grpc_host, grpc_port) = split(&self.grpc);
                command.envs([
                    ("HOST", host),
                    ("PORT", port),
                    ("GRPC_HOST", grpc_host),
                    ("GRPC_PORT", grpc_port),
                ]);
            }
        }
        command.args(&self.args);
        for (key, value) in &self.envs {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        let output = match &self.output {
            Output::Captured => {
                let file = tempfile::tempfile().expect("an anonymous file for the output");
                let copy = || file.try_clone().expect("a second handle on the output");
                command.stdout(copy()).stderr(copy());
                Some(file)
            }
            Output::File(path) => {
                let file = std::fs::File::create(path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let copy = file.try_clone().expect("a second handle on the log");
                command.stdout(file).stderr(copy);
                None
            }
            Output::PipedStdout => {
                command.stdout(Stdio::piped()).stderr(Stdio::null());
                None
            }
        };
        (command, output)
    }
}

/// `127.0.0.1:PORT` as its host and port.
fn split(addr: &str) -> (&str, &str) {
    addr.rsplit_once(':')
        .unwrap_or_else(|| panic!("{addr} is not HOST:PORT"))
}
