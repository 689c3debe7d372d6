//! Per-attempt step tokens: `<fence>.<hex HMAC-SHA256(key, "run/step/fence")>`. A step
//! gets its own in `SCARAB_STEP_TOKEN`; the output API recomputes it, so nothing is
//! stored, and a token names exactly one attempt.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::engine::{Fence, RunId};

/// 256 random bits from the kernel, as 64 hex digits: the admin token, the step-token
/// key, a dashboard session id or CSRF token.
pub fn random_hex() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The service's step-token key and the URL steps reach the API at.
#[derive(Clone)]
pub struct StepTokens {
    pub key: Vec<u8>,
    pub url: String,
}

impl std::fmt::Debug for StepTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepTokens")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl StepTokens {
    fn mac(&self, run: RunId, step: usize, fence: Fence) -> String {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC accepts any key length");
        mac.update(format!("{run}/{step}/{fence}").as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn token(&self, run: RunId, step: usize, fence: Fence) -> String {
        format!("{fence}.{}", self.mac(run, step, fence))
    }

    /// The fence a token was issued for, if it is genuine for this run and step.
    pub fn verify(&self, run: RunId, step: usize, token: &str) -> Option<Fence> {
        let (fence, mac) = token.split_once('.')?;
        let fence = Fence(fence.parse().ok()?);
        let expected = self.mac(run, step, fence);
        bool::from(expected.as_bytes().ct_eq(mac.as_bytes())).then_some(fence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_one_attempt() {
        let tokens = StepTokens {
            key: b"0123456789abcdef0123456789abcdef".to_vec(),
            url: "http://127.0.0.1:1".into(),
        };
        let token = tokens.token(RunId(5), 1, Fence(42));
        assert_eq!(tokens.verify(RunId(5), 1, &token), Some(Fence(42)));
        assert_eq!(tokens.verify(RunId(5), 2, &token), None, "another step");
        assert_eq!(tokens.verify(RunId(6), 1, &token), None, "another run");
        let forged = token.replacen("42.", "43.", 1);
        assert_eq!(tokens.verify(RunId(5), 1, &forged), None, "another fence");
        assert_eq!(tokens.verify(RunId(5), 1, "garbage"), None);
    }
}
