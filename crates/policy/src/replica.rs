//! Replica identities: a small `Copy` id for the engine, and a name registry for callers that know replicas by URL.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A replica as the engine knows it. The caller assigns the number and keeps it stable for a replica:
/// consistent hashing places a replica's virtual nodes by this number, so a replica that keeps its id
/// keeps its keys across restarts. [`ReplicaNames`] hands out such ids for URLs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ReplicaId(pub u32);

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

impl From<u32> for ReplicaId {
    fn from(value: u32) -> Self {
        Self(value)
    }
}

/// Interns replica names (URLs) to [`ReplicaId`]s in first-seen order and maps them back.
///
/// Ids are never reused, so an id seen in an old explanation never silently names another replica.
#[derive(Clone, Debug, Default)]
pub struct ReplicaNames {
    by_name: BTreeMap<String, ReplicaId>,
    names: Vec<String>,
}

impl ReplicaNames {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id for `name`, assigning the next free one the first time a name is seen.
    pub fn intern(&mut self, name: &str) -> ReplicaId {
        if let Some(id) = self.by_name.get(name) {
            return *id;
        }
        let id = ReplicaId(u32::try_from(self.names.len()).unwrap_or(u32::MAX));
        self.by_name.insert(name.to_owned(), id);
        self.names.push(name.to_owned());
        id
    }

    /// The id of a name seen before.
    pub fn id(&self, name: &str) -> Option<ReplicaId> {
        self.by_name.get(name).copied()
    }

    /// The name behind an id.
    pub fn name(&self, id: ReplicaId) -> Option<&str> {
        self.names.get(id.0 as usize).map(String::as_str)
    }

    /// How many names were interned.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no name was interned.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_ids_are_stable() {
        let mut names = ReplicaNames::new();
        let a = names.intern("http://a:8000");
        let b = names.intern("http://b:8000");
        assert_eq!(names.intern("http://a:8000"), a);
        assert_ne!(a, b);
        assert_eq!(names.name(b), Some("http://b:8000"));
        assert_eq!(names.id("http://a:8000"), Some(a));
        assert_eq!(names.len(), 2);
        assert_eq!(a.to_string(), "r0");
    }
}
