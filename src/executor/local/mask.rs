//! Masking of secret values in a step's output stream, before any byte reaches disk.
//!
//! The stream arrives in chunks of any size, so a value may be split across writes: the
//! masker holds back the shortest tail that could still be the start of a value, and only
//! that (never more than the longest value less one byte). Matches are leftmost, longest
//! first, and never overlap.

/// What a masked value is replaced with.
pub const MASK: &[u8] = b"***";

pub struct Masker {
    /// Longest first, so a value that contains another is masked whole.
    values: Vec<Vec<u8>>,
    /// Bytes held back: a prefix of some value, waiting for the next chunk.
    held: Vec<u8>,
}

impl Masker {
    /// Empty values are ignored (they would match everywhere).
    pub fn new<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Masker {
        let mut values: Vec<Vec<u8>> = values
            .into_iter()
            .filter(|v| !v.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        values.dedup();
        Masker {
            values,
            held: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Feeds a chunk; returns what can be written now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.values.is_empty() {
            return chunk.to_vec();
        }
        let mut input = std::mem::take(&mut self.held);
        input.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(input.len());
        let mut at = 0;
        while at < input.len() {
            let rest = &input[at..];
            if let Some(value) = self.values.iter().find(|v| rest.starts_with(v)) {
                out.extend_from_slice(MASK);
                at += value.len();
                continue;
            }
            // A value that may still complete with the next chunk: hold from here.
            if self
                .values
                .iter()
                .any(|v| v.len() > rest.len() && v.starts_with(rest))
            {
                self.held = rest.to_vec();
                return out;
            }
            out.push(input[at]);
            at += 1;
        }
        out
    }

    /// The end of the stream: what was held back cannot complete any more.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn whole(values: &[&[u8]], input: &[u8]) -> Vec<u8> {
        let mut masker = Masker::new(values.iter().copied());
        let mut out = masker.push(input);
        out.extend(masker.finish());
        out
    }

    #[test]
    fn masks_every_occurrence_longest_first() {
        let values: &[&[u8]] = &[b"hunter2", b"hunter"];
        assert_eq!(whole(values, b"a hunter2 b hunter c"), b"a *** b *** c");
        assert_eq!(whole(values, b"no secret here"), b"no secret here");
        assert_eq!(whole(&[b"aa"], b"aaaaa"), b"******a");
    }

    #[test]
    fn a_prefix_at_the_end_of_the_stream_is_written_as_it_is() {
        assert_eq!(whole(&[b"secret"], b"the secr"), b"the secr");
    }

    proptest! {
        /// However the stream is cut into writes, the masked output is the same as for
        /// the whole stream, and no value survives in it.
        #[test]
        fn splitting_never_changes_the_result(
            secret in "[a-c]{2,6}",
            input in "[a-d]{0,64}",
            cuts in proptest::collection::vec(0usize..64, 0..8),
        ) {
            let values: &[&[u8]] = &[secret.as_bytes()];
            let expected = whole(values, input.as_bytes());
            let mut masker = Masker::new(values.iter().copied());
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= input.len()).collect();
            cuts.sort_unstable();
            let mut out = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([input.len()]) {
                out.extend(masker.push(&input.as_bytes()[from..cut]));
                from = cut;
            }
            out.extend(masker.finish());
            prop_assert_eq!(&out, &expected);
            let leaked = expected.windows(secret.len()).any(|w| w == secret.as_bytes());
            prop_assert!(!leaked);
        }
    }
}
