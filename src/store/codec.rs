//! The one place records are encoded and decoded.
//!
//! A stored value is a format byte followed by the bincode 2 encoding (standard
//! configuration) of that format's record type (`records::v2`, `records::v3`, …). The engine's and the
//! store's own types never touch bytes: each stored kind implements [`Record`], which
//! converts to the current format's record to write and from any format this build
//! reads. Every format a released build wrote stays in [`READABLE_FORMATS`] forever.
//!
//! Writes are checked in pairs: [`encode`] decodes what it just encoded and encodes that
//! again, and refuses the value unless the bytes agree, so a record that would not read
//! back as written never reaches a commit.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The format this build writes.
pub const FORMAT_VERSION: u8 = 5;

/// Every format this build decodes: each one a released build wrote. Only ever grows.
pub const READABLE_FORMATS: &[u8] = &[2, 3, 4, 5];

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("{record}: empty record")]
    Empty { record: &'static str },
    #[error(
        "{record}: record format {found} is not one this build reads ({READABLE_FORMATS:?}); a newer scarab wrote it"
    )]
    UnsupportedVersion { record: &'static str, found: u8 },
    #[error("{record}: cannot encode: {error}")]
    Encode {
        record: &'static str,
        error: bincode::error::EncodeError,
    },
    #[error("{record}: cannot decode format {version}: {error}")]
    Decode {
        record: &'static str,
        version: u8,
        error: bincode::error::DecodeError,
    },
    #[error("{record}: {trailing} trailing bytes after a format {version} record")]
    Trailing {
        record: &'static str,
        version: u8,
        trailing: usize,
    },
    #[error("{record}: implausible value: {problem}")]
    Implausible {
        record: &'static str,
        problem: String,
    },
    #[error("{record}: does not read back as written (the encode/decode pair check failed)")]
    RoundTrip { record: &'static str },
}

/// A kind of stored value: how it becomes bytes in the current format, and how it is
/// read back from each format this build knows.
pub trait Record: Sized {
    /// The record's name in errors.
    const NAME: &'static str;
    /// The value in the current format (without the format byte).
    fn encode_current(&self, out: &mut Vec<u8>) -> Result<(), CodecError>;
    /// A value stored in `version` (one of `READABLE_FORMATS`).
    fn decode_format(version: u8, body: &[u8]) -> Result<Self, CodecError>;
}

/// Encodes `value` in the current format, checked to read back as written.
pub fn encode<R: Record>(value: &R) -> Result<Vec<u8>, CodecError> {
    let bytes = encode_unchecked(value)?;
    let again = encode_unchecked(&decode::<R>(&bytes)?)?;
    if again != bytes {
        return Err(CodecError::RoundTrip { record: R::NAME });
    }
    Ok(bytes)
}

fn encode_unchecked<R: Record>(value: &R) -> Result<Vec<u8>, CodecError> {
    let mut bytes = vec![FORMAT_VERSION];
    value.encode_current(&mut bytes)?;
    Ok(bytes)
}

/// Decodes a stored value of any format this build reads.
pub fn decode<R: Record>(bytes: &[u8]) -> Result<R, CodecError> {
    let (&version, body) = bytes
        .split_first()
        .ok_or(CodecError::Empty { record: R::NAME })?;
    if !READABLE_FORMATS.contains(&version) {
        return Err(CodecError::UnsupportedVersion {
            record: R::NAME,
            found: version,
        });
    }
    R::decode_format(version, body)
}

/// The bincode configuration of every format so far: standard (varint integers), with a
/// limit, so that a corrupted length prefix is an error rather than a huge allocation.
/// The limit changes no byte of the encoding.
fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ crate::limits::RECORD_MAX_BYTES }>()
}

/// The bincode encoding of one format's record type.
pub fn to_bincode<T: Serialize>(
    record: &'static str,
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    bincode::serde::encode_into_std_write(value, out, config())
        .map(|_| ())
        .map_err(|error| CodecError::Encode { record, error })
}

/// One format's record type from its bincode encoding; every byte must be used.
pub fn from_bincode<T: DeserializeOwned>(
    record: &'static str,
    version: u8,
    body: &[u8],
) -> Result<T, CodecError> {
    let (value, read) =
        bincode::serde::decode_from_slice(body, config()).map_err(|error| CodecError::Decode {
            record,
            version,
            error,
        })?;
    if read != body.len() {
        return Err(CodecError::Trailing {
            record,
            version,
            trailing: body.len() - read,
        });
    }
    Ok(value)
}
