//! Named definitions gathered from documents compiled into the binary (OpenAPI schemas,
//! protobuf message tables): each document is parsed the first time a kind asks for it and
//! kept for the life of the process, so lookups hand out `&'static` references.

use crate::hash::{HashMap, HashMapExt};
use std::sync::RwLock;

/// A table of definitions of type `V`, by name, from the documents loaded so far. The first
/// document to define a name answers for it (shared definitions are the same in every
/// document of a release).
pub(crate) struct Definitions<V: ?Sized + 'static> {
    tables: RwLock<Loaded<V>>,
    /// The definitions a document holds.
    parse: fn(&'static [u8]) -> Vec<(String, &'static V)>,
}

struct Loaded<V: ?Sized + 'static> {
    /// The documents loaded, by address.
    documents: Vec<usize>,
    definitions: HashMap<String, &'static V>,
}

impl<V: ?Sized> Definitions<V> {
    /// A table that reads documents with `parse`, starting with `first`.
    pub(crate) fn new(
        parse: fn(&'static [u8]) -> Vec<(String, &'static V)>,
        first: &'static [u8],
    ) -> Self {
        let table = Definitions {
            tables: RwLock::new(Loaded {
                documents: Vec::new(),
                definitions: HashMap::new(),
            }),
            parse,
        };
        table.load(first);
        table
    }

    /// A definition by name.
    pub(crate) fn get(&self, name: &str) -> Option<&'static V> {
        let loaded = self.tables.read().unwrap_or_else(|e| e.into_inner());
        loaded.definitions.get(name).copied()
    }

    /// Every definition loaded so far, with its name.
    pub(crate) fn entries(&self) -> Vec<(String, &'static V)> {
        let loaded = self.tables.read().unwrap_or_else(|e| e.into_inner());
        let entries = loaded.definitions.iter();
        entries.map(|(name, v)| (name.clone(), *v)).collect()
    }

    /// Adds a document's definitions (once per document).
    pub(crate) fn load(&self, document: &'static [u8]) {
        let address = document.as_ptr() as usize;
        let known = |loaded: &Loaded<V>| loaded.documents.contains(&address);
        if known(&self.tables.read().unwrap_or_else(|e| e.into_inner())) {
            return;
        }
        let mut loaded = self.tables.write().unwrap_or_else(|e| e.into_inner());
        if known(&loaded) {
            return;
        }
        loaded.documents.push(address);
        for (name, definition) in (self.parse)(document) {
            loaded.definitions.entry(name).or_insert(definition);
        }
    }
}
