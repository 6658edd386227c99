//! Validated identifiers: `SessionId`, `MessageId`; and `mint_retry_id`, the runtime's source of
//! retry-chain ids.
//!
//! A `SessionId` names an agent and its log everywhere (store rows, CLI arguments, the registry). It is
//! checked once, when it enters from outside, and the type records that the check happened: only ASCII
//! letters, digits, `_`, `-` and `.`, starting with a letter or digit, at most
//! `Limits::DEFAULT.session_id_bytes_max` bytes. So no id can be `.`/`..`, contain a separator, or name a
//! path, whatever a store later does with it.
//!
//! A `MessageId` identifies one user message from inbox insertion to its `user/message` event; it must
//! be unique among pending messages. It is any non-empty string of at most
//! `Limits::DEFAULT.message_id_bytes_max` bytes without control characters.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::limits::Limits;

/// Why an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The id is empty.
    #[error("{what} is empty")]
    Empty {
        /// Which kind of id.
        what: &'static str,
    },
    /// The id is longer than the limit.
    #[error("{what} is {bytes} bytes, the limit is {bytes_max}")]
    TooLong {
        /// Which kind of id.
        what: &'static str,
        /// Its length.
        bytes: usize,
        /// The limit.
        bytes_max: usize,
    },
    /// The id holds a character that is not allowed.
    #[error("{what} {shown:?} has a character that is not allowed at byte {at}")]
    BadChar {
        /// Which kind of id.
        what: &'static str,
        /// The id, shortened for the message.
        shown: String,
        /// The byte offset of the character.
        at: usize,
    },
}

/// Shows at most 40 characters of a refused id, so an error line stays one line.
fn shown(s: &str) -> String {
    s.chars().take(40).collect()
}

/// A validated session (= agent) id. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// Validates `s` as a session id.
    ///
    /// # Errors
    /// `IdError` when `s` is empty, too long, or has a character outside `[A-Za-z0-9_.-]` (or does not
    /// start with a letter or digit).
    pub fn new(s: &str) -> Result<SessionId, IdError> {
        const WHAT: &str = "session id";
        if s.is_empty() {
            return Err(IdError::Empty { what: WHAT });
        }
        let bytes_max = Limits::DEFAULT.session_id_bytes_max;
        if s.len() > bytes_max {
            return Err(IdError::TooLong {
                what: WHAT,
                bytes: s.len(),
                bytes_max,
            });
        }
        for (at, b) in s.bytes().enumerate() {
            let ok = b.is_ascii_alphanumeric() || (at > 0 && matches!(b, b'_' | b'-' | b'.'));
            if !ok {
                return Err(IdError::BadChar {
                    what: WHAT,
                    shown: shown(s),
                    at,
                });
            }
        }
        Ok(SessionId(Arc::from(s)))
    }

    /// A fresh random id (`s-` followed by 32 hex digits).
    pub fn mint() -> SessionId {
        let id = uuid::Uuid::new_v4().simple().to_string();
        SessionId(Arc::from(format!("s-{id}").as_str()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for SessionId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SessionId::new(s)
    }
}

impl Serialize for SessionId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SessionId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        SessionId::new(&s).map_err(serde::de::Error::custom)
    }
}

/// A validated message id. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(Arc<str>);

impl MessageId {
    /// Validates `s` as a message id.
    ///
    /// # Errors
    /// `IdError` when `s` is empty, longer than the limit, or contains a control character.
    pub fn new(s: &str) -> Result<MessageId, IdError> {
        const WHAT: &str = "message id";
        if s.is_empty() {
            return Err(IdError::Empty { what: WHAT });
        }
        let bytes_max = Limits::DEFAULT.message_id_bytes_max;
        if s.len() > bytes_max {
            return Err(IdError::TooLong {
                what: WHAT,
                bytes: s.len(),
                bytes_max,
            });
        }
        if let Some((at, _)) = s.char_indices().find(|(_, c)| c.is_control()) {
            return Err(IdError::BadChar {
                what: WHAT,
                shown: shown(s),
                at,
            });
        }
        Ok(MessageId(Arc::from(s)))
    }

    /// A fresh random id (a UUID v4, as the original mints them).
    pub fn mint() -> MessageId {
        MessageId(Arc::from(uuid::Uuid::new_v4().to_string().as_str()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where an agent's new message ids come from. The pure turn machine never mints an id itself: the
/// runtime lends it `MessageIds::random()`, and a test a deterministic source.
#[derive(Clone)]
pub struct MessageIds(Arc<dyn Fn() -> MessageId + Send + Sync>);

impl MessageIds {
    /// Fresh random ids (UUID v4), as the runtime uses.
    pub fn random() -> MessageIds {
        MessageIds(Arc::new(MessageId::mint))
    }

    /// Ids made by `mint`, e.g. a counter in a test.
    pub fn from_fn(mint: impl Fn() -> MessageId + Send + Sync + 'static) -> MessageIds {
        MessageIds(Arc::new(mint))
    }

    /// The next id.
    pub fn next_id(&self) -> MessageId {
        (self.0)()
    }
}

/// A fresh retry-chain id (a UUID v4, as the original mints them). The runtime draws one for every
/// `request_error` context (`RequestErrorCtx::new_retry_id`), so the retry policy mints none.
pub fn mint_retry_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl fmt::Debug for MessageIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MessageIds")
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for MessageId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for MessageId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        MessageId::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_cannot_name_paths() {
        for bad in [
            "", ".", "..", "../x", "a/b", "a\\b", "-x", "_x", "a b", "a\0", "é",
        ] {
            assert!(SessionId::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "s-0123", "A.b_c-d", "9"] {
            assert_eq!(
                SessionId::new(good).map(|s| s.to_string()),
                Ok(good.to_string())
            );
        }
        let long = "a".repeat(129);
        assert_eq!(
            SessionId::new(&long),
            Err(IdError::TooLong {
                what: "session id",
                bytes: 129,
                bytes_max: 128
            })
        );
        assert!(SessionId::new(&SessionId::mint().to_string()).is_ok());
    }

    #[test]
    fn message_ids_refuse_control_characters() {
        assert!(MessageId::new("m1").is_ok());
        assert!(MessageId::new("with space/and:colon").is_ok());
        assert!(MessageId::new("a\nb").is_err());
        assert!(MessageId::new("").is_err());
    }

    #[test]
    fn retry_ids_are_fresh_uuid_v4s() {
        let (a, b) = (mint_retry_id(), mint_retry_id());
        assert_ne!(a, b);
        for id in [&a, &b] {
            assert_eq!(
                uuid::Uuid::parse_str(id).map(|u| u.get_version_num()),
                Ok(4),
                "{id}"
            );
        }
    }
}
