//! The one place records are encoded: bincode 2 (standard config) behind a format
//! version byte, so a future encoding can be told apart from today's.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The first byte of every encoded record.
pub const FORMAT_VERSION: u8 = 2;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("empty record")]
    Empty,
    #[error("record format version {found} is not supported (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion { found: u8 },
    #[error("cannot encode record: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("cannot decode record: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("record has {0} trailing bytes")]
    Trailing(usize),
}

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut bytes = vec![FORMAT_VERSION];
    bincode::serde::encode_into_std_write(value, &mut bytes, bincode::config::standard())?;
    Ok(bytes)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(CodecError::UnsupportedVersion { found: version });
    }
    let (value, read) = bincode::serde::decode_from_slice(body, bincode::config::standard())?;
    if read != body.len() {
        return Err(CodecError::Trailing(body.len() - read));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_foreign_versions() {
        let value = (7u64, "fence".to_string(), Some(vec![1u8, 2]));
        let bytes = encode(&value).expect("encodes");
        assert_eq!(bytes[0], FORMAT_VERSION);
        let back: (u64, String, Option<Vec<u8>>) = decode(&bytes).expect("decodes");
        assert_eq!(back, value);
        let mut foreign = bytes.clone();
        foreign[0] = 9;
        assert!(matches!(
            decode::<(u64, String, Option<Vec<u8>>)>(&foreign),
            Err(CodecError::UnsupportedVersion { found: 9 })
        ));
        assert!(matches!(decode::<u64>(&[]), Err(CodecError::Empty)));
    }
}
