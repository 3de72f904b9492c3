//! `--store` URLs for Redis: which servers, which topology, which credentials.
//!
//! - `redis://[user:password@]host[:port][/db]`: one server (`rediss://` for TLS);
//! - `redis+sentinel://[user:password@]host:port[,host:port…]/master-name[/db]`: the master
//!   that the Sentinels name (`rediss+sentinel://` for TLS to the master). The credentials are
//!   the master's; Sentinels are reached without them;
//! - `redis+cluster://[user:password@]host:port[,host:port…]`: a Cluster, discovered from any of
//!   the seed nodes (`rediss+cluster://` for TLS).
//!
//! User and password are percent-decoded, so a password may hold any character.

use std::fmt;

use crate::ConnectError;

/// The default Redis port.
const REDIS_PORT: u16 = 6379;
/// The default Sentinel port.
const SENTINEL_PORT: u16 = 26379;

/// A parsed Redis store URL.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// Which topology, and its servers.
    pub topology: Topology,
    /// The ACL user, if any.
    pub username: Option<String>,
    /// The password, if any.
    pub password: Option<String>,
    /// Whether to speak TLS to the Redis servers.
    pub tls: bool,
    /// The database number (standalone and Sentinel only).
    pub db: i64,
}

/// How the Redis servers are arranged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server.
    Standalone {
        /// Host and port.
        host: (String, u16),
    },
    /// A master found through Sentinels.
    Sentinel {
        /// The Sentinels' hosts and ports.
        sentinels: Vec<(String, u16)>,
        /// The master's name, as configured in the Sentinels.
        master: String,
    },
    /// A Cluster, found from seed nodes.
    Cluster {
        /// The seed nodes' hosts and ports.
        nodes: Vec<(String, u16)>,
    },
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisUrl")
            .field("topology", &self.topology)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("db", &self.db)
            .finish()
    }
}

impl fmt::Display for RedisUrl {
    /// The URL with the password masked, for logs and errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.tls { "s" } else { "" };
        let hosts = |hs: &[(String, u16)]| {
            hs.iter()
                .map(|(h, p)| format!("{h}:{p}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let (scheme, hosts, path) = match &self.topology {
            Topology::Standalone { host } => {
                ("redis", hosts(std::slice::from_ref(host)), String::new())
            }
            Topology::Sentinel { sentinels, master } => {
                ("redis+sentinel", hosts(sentinels), format!("/{master}"))
            }
            Topology::Cluster { nodes } => ("redis+cluster", hosts(nodes), String::new()),
        };
        let scheme = scheme.replacen("redis", &format!("redis{s}"), 1);
        write!(f, "{scheme}://")?;
        match (&self.username, &self.password) {
            (Some(u), Some(_)) => write!(f, "{u}:***@")?,
            (Some(u), None) => write!(f, "{u}@")?,
            (None, Some(_)) => write!(f, ":***@")?,
            (None, None) => {}
        }
        write!(f, "{hosts}{path}")?;
        if self.db != 0 && !matches!(self.topology, Topology::Cluster { .. }) {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

impl RedisUrl {
    /// Parses a store URL. Every error says what the URL should look like.
    pub fn parse(url: &str) -> Result<RedisUrl, ConnectError> {
        let invalid = |reason: &str| ConnectError::InvalidUrl {
            url: mask(url),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("expected a scheme such as redis://host:6379"))?;
        let (tls, kind) = match scheme.to_ascii_lowercase().as_str() {
            "redis" => (false, 0),
            "rediss" => (true, 0),
            "redis+sentinel" => (false, 1),
            "rediss+sentinel" => (true, 1),
            "redis+cluster" => (false, 2),
            "rediss+cluster" => (true, 2),
            _ => {
                return Err(invalid(
                    "unknown scheme; use redis://, rediss://, redis+sentinel:// or redis+cluster://",
                ));
            }
        };
        // Drop a query string or fragment: the store takes its options elsewhere.
        let rest = rest.split(['?', '#']).next().unwrap_or("");
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(ui) => {
                let (u, p) = match ui.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (ui, None),
                };
                let u = percent_decode(u).ok_or_else(|| invalid("bad percent-escape in user"))?;
                let p = match p {
                    Some(p) => Some(
                        percent_decode(p)
                            .ok_or_else(|| invalid("bad percent-escape in password"))?,
                    ),
                    None => None,
                };
                ((!u.is_empty()).then_some(u), p.filter(|p| !p.is_empty()))
            }
        };
        let default_port = if kind == 1 { SENTINEL_PORT } else { REDIS_PORT };
        let hosts = hosts
            .split(',')
            .map(|h| parse_host(h, default_port))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|r| invalid(&r))?;
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let parse_db = |s: &str| {
            s.parse::<i64>()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| invalid("the database must be a number such as /0"))
        };
        let (topology, db) = match kind {
            0 => {
                let [host] = <[_; 1]>::try_from(hosts).map_err(|_| {
                    invalid("redis:// takes one host; use redis+cluster:// or redis+sentinel:// for several")
                })?;
                let db = match segments.as_slice() {
                    [] => 0,
                    [db] => parse_db(db)?,
                    _ => return Err(invalid("expected at most a database number as the path")),
                };
                (Topology::Standalone { host }, db)
            }
            1 => {
                let (master, db) = match segments.as_slice() {
                    [master] => (master, 0),
                    [master, db] => (master, parse_db(db)?),
                    _ => {
                        return Err(invalid(
                            "expected the master's name as the path: redis+sentinel://host:26379/mymaster",
                        ));
                    }
                };
                let master = percent_decode(master)
                    .ok_or_else(|| invalid("bad percent-escape in the master name"))?;
                (
                    Topology::Sentinel {
                        sentinels: hosts,
                        master,
                    },
                    db,
                )
            }
            _ => {
                if !segments.is_empty() {
                    return Err(invalid(
                        "a cluster has no databases or path: redis+cluster://host:port,host:port",
                    ));
                }
                (Topology::Cluster { nodes: hosts }, 0)
            }
        };
        Ok(RedisUrl {
            topology,
            username,
            password,
            tls,
            db,
        })
    }
}

/// `host[:port]` or `[v6]:port`.
fn parse_host(h: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = h.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("unclosed `[` in host `{h}`"))?;
        (addr, after.strip_prefix(':'))
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        }
    };
    if host.is_empty() {
        return Err("a host is empty; write host:port, separated by commas".to_owned());
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("the port of `{h}` is not a number from 1 to 65535"))?,
    };
    Ok((host.to_owned(), port))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The URL with whatever sits between `:` and `@` in the authority masked.
fn mask(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> RedisUrl {
        RedisUrl::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn standalone_urls() {
        let u = ok("redis://localhost");
        assert_eq!(
            u.topology,
            Topology::Standalone {
                host: ("localhost".into(), 6379)
            }
        );
        assert_eq!(
            (u.tls, u.db, u.username, u.password),
            (false, 0, None, None)
        );
        let u = ok("rediss://alice:p%40ss%3Aword@10.0.0.1:6380/2");
        assert!(u.tls);
        assert_eq!(u.db, 2);
        assert_eq!(u.username.as_deref(), Some("alice"));
        assert_eq!(u.password.as_deref(), Some("p@ss:word"));
        let u = ok("redis://:secret@[::1]:7000");
        assert_eq!(u.username, None);
        assert_eq!(u.password.as_deref(), Some("secret"));
        assert_eq!(
            u.topology,
            Topology::Standalone {
                host: ("::1".into(), 7000)
            }
        );
    }

    #[test]
    fn sentinel_and_cluster_urls() {
        let u = ok("redis+sentinel://s1,s2:26380/mymaster/1");
        assert_eq!(
            u.topology,
            Topology::Sentinel {
                sentinels: vec![("s1".into(), 26379), ("s2".into(), 26380)],
                master: "mymaster".into()
            }
        );
        assert_eq!(u.db, 1);
        let u = ok("redis+cluster://u:p@a:7000,b:7001,c");
        assert_eq!(
            u.topology,
            Topology::Cluster {
                nodes: vec![("a".into(), 7000), ("b".into(), 7001), ("c".into(), 6379)]
            }
        );
        assert_eq!(u.password.as_deref(), Some("p"));
    }

    #[test]
    fn errors_say_what_to_write_and_hide_the_password() {
        for (url, hint) in [
            ("localhost:6379", "scheme"),
            ("memcached://x", "unknown scheme"),
            ("redis://a,b", "one host"),
            ("redis://h:99999", "port"),
            ("redis://h/x", "database"),
            ("redis+sentinel://h", "master"),
            ("redis+cluster://a/0", "cluster"),
            ("redis://u:se%ZZcret@h", "percent"),
        ] {
            let e = RedisUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(hint), "{url}: {e}");
        }
        let e = RedisUrl::parse("redis://u:hunter2@a,b")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        let shown = ok("redis+sentinel://u:hunter2@s1/m").to_string();
        assert_eq!(shown, "redis+sentinel://u:***@s1:26379/m");
        assert!(!format!("{:?}", ok("redis://:hunter2@h")).contains("hunter2"));
    }
}
