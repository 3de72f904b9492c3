//! A route's path pattern, and how it matches a request's path and captures its parameters.

use std::fmt;

/// One segment of a path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// This exact segment.
    Literal(String),
    /// Any non-empty segment, captured under a name.
    Param(String),
    /// Whatever is left of the path starts with this (`/api*`).
    Prefix(String),
}

/// A path pattern: `/health` (exact), `/api/*` (the segment and anything under it), `/api*`
/// (a plain prefix), `/users/{id}` (one segment captured) or `/files/{*rest}` (the rest
/// captured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
    /// What may follow the segments: nothing, anything, or anything captured under a name.
    tail: Tail,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tail {
    None,
    Any,
    Capture(String),
}

impl PathPattern {
    /// Parses a pattern; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<PathPattern, &'static str> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err("a path pattern starts with `/`");
        };
        let mut segments = Vec::new();
        let mut tail = Tail::None;
        let parts: Vec<&str> = rest.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                if let Some(name) = inner.strip_prefix('*') {
                    if !last {
                        return Err("`{*name}` may only end a path pattern");
                    }
                    if name.is_empty() || name.contains(['{', '}', '*']) {
                        return Err("`{*}` needs a name, such as `{*rest}`");
                    }
                    tail = Tail::Capture(name.to_owned());
                } else if inner.is_empty() || inner.contains(['{', '}', '*']) {
                    return Err("a parameter is a name in braces, such as `{id}`");
                } else {
                    segments.push(Segment::Param(inner.to_owned()));
                }
            } else if part.contains(['{', '}']) {
                return Err("a parameter fills a whole segment, such as `/users/{id}`");
            } else if let Some(prefix) = part.strip_suffix('*') {
                if !last || prefix.contains('*') {
                    return Err("`*` may only end a path pattern");
                }
                if prefix.is_empty() {
                    tail = Tail::Any;
                } else {
                    segments.push(Segment::Prefix(prefix.to_owned()));
                }
            } else if part.contains('*') {
                return Err("`*` may only end a path pattern");
            } else {
                segments.push(Segment::Literal((*part).to_owned()));
            }
        }
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
            tail,
        })
    }

    /// The names of the parameters the pattern captures.
    pub fn params(&self) -> impl Iterator<Item = &str> {
        self.segments
            .iter()
            .filter_map(|s| match s {
                Segment::Param(n) => Some(n.as_str()),
                _ => None,
            })
            .chain(match &self.tail {
                Tail::Capture(n) => Some(n.as_str()),
                _ => None,
            })
    }

    /// Matches `path` (without its query), returning the captured parameters. A trailing slash
    /// is tolerated: `/health` matches `/health/`.
    pub fn matches<'p>(&self, path: &'p str) -> Option<Vec<(&str, &'p str)>> {
        let mut rest = path.strip_prefix('/')?;
        let mut captured = Vec::new();
        for (i, segment) in self.segments.iter().enumerate() {
            if let Segment::Prefix(p) = segment {
                return rest.starts_with(p.as_str()).then_some(captured);
            }
            let (part, after) = match rest.split_once('/') {
                Some((p, a)) => (p, Some(a)),
                None => (rest, None),
            };
            match segment {
                Segment::Literal(l) if l == part => {}
                Segment::Param(name) if !part.is_empty() => captured.push((name.as_str(), part)),
                _ => return None,
            }
            match after {
                Some(a) => rest = a,
                None if i + 1 < self.segments.len() => return None,
                None => {
                    // The path ends with the last segment: `/api/*` matches `/api` too.
                    if let Tail::Capture(name) = &self.tail {
                        captured.push((name.as_str(), ""));
                    }
                    return Some(captured);
                }
            }
        }
        match &self.tail {
            Tail::None => rest.is_empty().then_some(captured),
            Tail::Any => Some(captured),
            Tail::Capture(name) => {
                captured.push((name.as_str(), rest));
                Some(captured)
            }
        }
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m<'p>(pattern: &str, path: &'p str) -> Option<Vec<(String, &'p str)>> {
        let p = PathPattern::parse(pattern).unwrap();
        p.matches(path)
            .map(|v| v.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }

    #[test]
    fn path_patterns() {
        assert_eq!(m("/health", "/health"), Some(vec![]));
        assert_eq!(m("/health", "/health/x"), None);
        assert_eq!(m("/health", "/healthz"), None);
        assert_eq!(m("/api/*", "/api/users"), Some(vec![]));
        assert_eq!(m("/api/*", "/api"), Some(vec![]));
        assert_eq!(m("/api/*", "/apiary"), None);
        assert_eq!(m("/*", "/anything/at/all"), Some(vec![]));
        assert_eq!(m("/api*", "/apiary/x"), Some(vec![]));
        assert_eq!(m("/api*", "/ap"), None);
        assert_eq!(
            m("/users/{id}", "/users/42"),
            Some(vec![("id".into(), "42")])
        );
        assert_eq!(m("/users/{id}", "/users/"), None);
        assert_eq!(m("/users/{id}", "/users/42/posts"), None);
        assert_eq!(
            m("/users/{id}/*", "/users/42/posts/1"),
            Some(vec![("id".into(), "42")])
        );
        assert_eq!(
            m("/files/{*rest}", "/files/a/b.txt"),
            Some(vec![("rest".into(), "a/b.txt")])
        );
        assert!(PathPattern::parse("api").is_err());
        assert!(PathPattern::parse("/a/*/b").is_err());
        assert!(PathPattern::parse("/a/x{id}").is_err());
        assert!(PathPattern::parse("/a/{}").is_err());
    }
}
