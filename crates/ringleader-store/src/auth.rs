//! Mutual proof of a shared token without sending it.
//!
//! Each side picks a fresh random nonce; the client proves it knows the
//! token with an HMAC over both nonces and the identity it claims, and the
//! server answers with an HMAC over the same nonces under another label. The
//! labels keep one side's proof from being replayed as the other's, and the
//! nonces keep an old proof from being replayed at all. The token itself
//! never crosses the wire.

use crate::job::Role;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// What both proofs cover besides the token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transcript<'a> {
    pub(crate) server_nonce: &'a [u8; 32],
    pub(crate) client_nonce: &'a [u8; 32],
    pub(crate) run_id: &'a str,
    pub(crate) role: Role,
    pub(crate) rank: Option<u32>,
}

impl Transcript<'_> {
    fn mac(&self, token: &str, label: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(token.as_bytes()).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(self.server_nonce);
        mac.update(self.client_nonce);
        mac.update(&(self.run_id.len() as u64).to_le_bytes());
        mac.update(self.run_id.as_bytes());
        mac.update(&[self.role.code()]);
        mac.update(&self.rank.unwrap_or(u32::MAX).to_le_bytes());
        mac
    }

    /// The client's proof.
    pub(crate) fn client_mac(&self, token: &str) -> [u8; 32] {
        self.mac(token, b"ringleader-store client v1").finalize().into_bytes().into()
    }

    /// The server's proof.
    pub(crate) fn server_mac(&self, token: &str) -> [u8; 32] {
        self.mac(token, b"ringleader-store server v1").finalize().into_bytes().into()
    }

    /// Checks the client's proof in constant time.
    pub(crate) fn verify_client(&self, token: &str, mac: &[u8; 32]) -> bool {
        self.mac(token, b"ringleader-store client v1").verify_slice(mac).is_ok()
    }

    /// Checks the server's proof in constant time.
    pub(crate) fn verify_server(&self, token: &str, mac: &[u8; 32]) -> bool {
        self.mac(token, b"ringleader-store server v1").verify_slice(mac).is_ok()
    }
}

/// A fresh random nonce.
pub(crate) fn nonce() -> [u8; 32] {
    use rand::RngCore;
    let mut n = [0u8; 32];
    rand::rng().fill_bytes(&mut n);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript<'a>(s: &'a [u8; 32], c: &'a [u8; 32]) -> Transcript<'a> {
        Transcript { server_nonce: s, client_nonce: c, run_id: "job", role: Role::Member, rank: Some(3) }
    }

    #[test]
    fn proofs_verify_only_with_the_same_token_and_label() {
        let (s, c) = (nonce(), nonce());
        let t = transcript(&s, &c);
        let m = t.client_mac("secret");
        assert!(t.verify_client("secret", &m));
        assert!(!t.verify_client("other", &m));
        assert!(!t.verify_server("secret", &m), "a client proof is no server proof");
        assert!(t.verify_server("secret", &t.server_mac("secret")));
    }

    #[test]
    fn proofs_bind_the_claimed_identity() {
        let (s, c) = (nonce(), nonce());
        let m = transcript(&s, &c).client_mac("secret");
        let other_rank = Transcript { rank: Some(4), ..transcript(&s, &c) };
        assert!(!other_rank.verify_client("secret", &m));
        let other_nonce = nonce();
        assert!(!transcript(&other_nonce, &c).verify_client("secret", &m));
    }
}
