//! The counts a `RateLimitRequest` may carry, checked on its wire bytes before it is decoded.
//!
//! Decoding builds every descriptor and entry the message holds before
//! [`LimitRequest::validate`](sluice_limiter::LimitRequest::validate) can refuse their number:
//! a 64 KiB message of 32,000 empty descriptors cost 17 normal requests' worth of work (each
//! descriptor a struct and a vector, every one dropped again) only to be refused. Here the
//! message's fields are walked without building anything, and the walk stops at the first
//! descriptor past [`MAX_DESCRIPTORS`], or the first entry past [`MAX_ENTRIES`] in one
//! descriptor: a refusal costs a few hundred steps, however many the message holds. Anything
//! the walk cannot read is left to the decoder, which says what is wrong with it.
//!
//! ```
//! use sluice_server::wire_bounds::check;
//!
//! // 65 empty descriptors: field 2, length 0, each.
//! let message = [0x12, 0x00].repeat(65);
//! let refused = check(&message).unwrap_err();
//! assert!(refused.to_string().contains("limit of 64"), "{refused}");
//! assert!(check(&[0x12, 0x00].repeat(64)).is_ok());
//! ```

use sluice_limiter::InvalidRequest;
use sluice_limiter::limits::{MAX_DESCRIPTORS, MAX_ENTRIES};

/// `RateLimitRequest.descriptors`.
const DESCRIPTORS: u64 = 2;
/// `RateLimitDescriptor.entries`.
const ENTRIES: u64 = 1;

/// Refuses `message` (an encoded `RateLimitRequest`) when it has more descriptors than
/// [`MAX_DESCRIPTORS`] or a descriptor with more entries than [`MAX_ENTRIES`], with the error
/// [`LimitRequest::validate`](sluice_limiter::LimitRequest::validate) gives (the count it names
/// is the first past the bound: the rest is not counted). A message it cannot read passes, for
/// the decoder to refuse.
pub fn check(message: &[u8]) -> Result<(), InvalidRequest> {
    let mut descriptors = 0;
    for field in Fields(message) {
        let Field::Bytes(DESCRIPTORS, descriptor) = field else {
            continue;
        };
        descriptors += 1;
        if descriptors > MAX_DESCRIPTORS {
            return Err(too_large(
                "descriptors".into(),
                descriptors,
                MAX_DESCRIPTORS,
            ));
        }
        let mut entries = 0;
        for field in Fields(descriptor) {
            if matches!(field, Field::Bytes(ENTRIES, _)) {
                entries += 1;
                if entries > MAX_ENTRIES {
                    let name = format!("descriptors[{}].entries", descriptors - 1);
                    return Err(too_large(name, entries, MAX_ENTRIES));
                }
            }
        }
    }
    Ok(())
}

fn too_large(field: String, got: usize, max: usize) -> InvalidRequest {
    InvalidRequest::TooLarge { field, got, max }
}

/// One field of a protobuf message: a length-delimited one with its number and bytes, or
/// another kind.
enum Field<'a> {
    Bytes(u64, &'a [u8]),
    Other,
}

/// The fields of a protobuf message in order; ends at the message's end or at the first bytes
/// that are not a field.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Field<'a>;

    fn next(&mut self) -> Option<Field<'a>> {
        let key = varint(&mut self.0)?;
        let (number, wire_type) = (key >> 3, key & 7);
        let skip = match wire_type {
            0 => {
                varint(&mut self.0)?;
                return Some(Field::Other);
            }
            1 => 8,
            2 => {
                let len = usize::try_from(varint(&mut self.0)?).ok()?;
                let bytes = self.0.get(..len)?;
                self.0 = &self.0[len..];
                return Some(Field::Bytes(number, bytes));
            }
            5 => 4,
            // Groups (deprecated, in no field of these messages) and invalid wire types.
            _ => return None,
        };
        self.0 = self.0.get(skip..)?;
        Some(Field::Other)
    }
}

/// A base-128 varint from the front of `bytes`, consumed; `None` when it is cut short or longer
/// than ten bytes.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use prost::Message;

    use super::*;

    fn message(descriptors: usize, entries: usize) -> Vec<u8> {
        let descriptor = RateLimitDescriptor {
            entries: (0..entries)
                .map(|i| Entry {
                    key: format!("k{i}"),
                    value: "v".repeat(300),
                })
                .collect(),
            ..Default::default()
        };
        RateLimitRequest {
            domain: "shop".into(),
            descriptors: vec![descriptor; descriptors],
            hits_addend: 3,
        }
        .encode_to_vec()
    }

    #[test]
    fn counts_at_the_bounds_pass_and_one_more_is_refused_with_its_field() {
        assert!(check(&message(MAX_DESCRIPTORS, 2)).is_ok());
        assert!(check(&message(2, MAX_ENTRIES)).is_ok());
        assert_eq!(
            check(&message(MAX_DESCRIPTORS + 1, 1))
                .unwrap_err()
                .to_string(),
            "`descriptors` has 65, more than the limit of 64"
        );
        assert_eq!(
            check(&message(3, MAX_ENTRIES + 1)).unwrap_err().to_string(),
            "`descriptors[0].entries` has 33, more than the limit of 32"
        );
    }

    proptest::proptest! {
        /// The wire refuses exactly the messages whose counts are past the bounds, whatever
        /// the mix of descriptor sizes.
        #[test]
        fn refuses_exactly_the_counts_past_the_bounds(
            entries in proptest::collection::vec(0usize..40, 0..80)
        ) {
            let request = RateLimitRequest {
                domain: "shop".into(),
                descriptors: entries
                    .iter()
                    .map(|&n| RateLimitDescriptor {
                        entries: vec![Entry { key: "k".into(), value: "v".into() }; n],
                        ..Default::default()
                    })
                    .collect(),
                hits_addend: 1,
            };
            let past = entries.len() > MAX_DESCRIPTORS
                || entries.iter().any(|&n| n > MAX_ENTRIES);
            proptest::prop_assert_eq!(check(&request.encode_to_vec()).is_err(), past);
        }
    }

    #[test]
    fn what_it_cannot_read_is_left_to_the_decoder() {
        for broken in [&[0x12, 0x05, 0x00][..], &[0x80], &[0x13], &[0x09, 0, 0]] {
            assert!(check(broken).is_ok(), "{broken:?}");
        }
    }
}
