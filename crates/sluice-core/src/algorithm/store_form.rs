//! A policy as a store outside the process sees it: the numbers its scripts decide on, and the
//! numbers it must hold exactly. Each algorithm's module says which they are for its policies,
//! so that a store encodes and bounds any policy without naming an algorithm.

use std::time::Duration;

use crate::policy::Rate;

/// The four parameters a store's script decides a policy on (the Redis scripts' `p1..p4`), in
/// the order of the algorithm's Lua; `None` where the algorithm takes fewer.
pub type StoreParams = [Option<u64>; 4];

/// One number of a policy that a store computing in limited precision (Redis's Lua, in doubles)
/// must hold exactly, named for its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Magnitude {
    /// A count, such as a limit or a capacity.
    Count(&'static str, u64),
    /// A length of time, such as a window or an interval.
    Length(&'static str, Duration),
    /// The length of a window that starts on whole microseconds (of the clock, or of a key's
    /// first request): its every time is then a multiple of the clock's step when the length is
    /// whole microseconds, which lets a store hold longer ones.
    LongWindow(Duration),
    /// The longest backlog: `count` intervals of `interval` ahead of now.
    Backlog(&'static str, u64, Duration),
    /// A refill rate, held in its lowest terms.
    Rate(Rate),
}

/// The numbers of one policy that a store must hold exactly, at most three, held inline: a
/// store checks them before every call, so they allocate nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Magnitudes {
    items: [Option<Magnitude>; 3],
}

impl Magnitudes {
    /// These `N` numbers (three at most).
    pub(crate) fn of<const N: usize>(numbers: [Magnitude; N]) -> Self {
        const { assert!(N <= 3, "a policy has at most three magnitudes") };
        let mut items = [None; 3];
        for (slot, number) in items.iter_mut().zip(numbers) {
            *slot = Some(number);
        }
        Magnitudes { items }
    }

    /// These numbers and `number` after them, if there is room (there is for every algorithm's).
    pub(crate) fn and(mut self, number: Magnitude) -> Self {
        if let Some(slot) = self.items.iter_mut().find(|slot| slot.is_none()) {
            *slot = Some(number);
        }
        self
    }
}

impl IntoIterator for Magnitudes {
    type Item = Magnitude;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<Magnitude>, 3>>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magnitudes_keep_their_order() {
        let a = Magnitude::Count("limit", 5);
        let b = Magnitude::Length("window", Duration::from_secs(1));
        let c = Magnitude::LongWindow(Duration::from_secs(2));
        let all: Vec<Magnitude> = Magnitudes::of([a, b]).and(c).into_iter().collect();
        assert_eq!(all, [a, b, c]);
        assert_eq!(Magnitudes::of([]).into_iter().count(), 0);
        // A fourth has no room; no algorithm has one.
        let full: Vec<Magnitude> = Magnitudes::of([a, b, c]).and(a).into_iter().collect();
        assert_eq!(full, [a, b, c]);
    }
}
