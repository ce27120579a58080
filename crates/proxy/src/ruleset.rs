//! What one owner (the table's fixed part, or one Service) puts in a table, and the nftables
//! transaction that turns what is there into what should be: all of it (a full sync), or only
//! the owners that changed (a partial sync, upstream's `syncProxyRules` with `tryPartialSync`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

/// Each (set, key) in the table: the element written for it and how many owners want that
/// element. Two Services can need the same element (a hairpin entry for an endpoint they
/// share), and it goes only when the last one lets go; two that want different values for one
/// key (an external IP and port both claim) get the last writer's, as upstream.
pub type ElementRefs = HashMap<(String, String), (String, u32)>;

/// An element's key: what comes before its comment or its value.
fn element_key(element: &str) -> &str {
    let end = [element.find(" comment "), element.find(" : ")]
        .into_iter()
        .flatten()
        .min();
    &element[..end.unwrap_or(element.len())]
}

impl Transaction {
    /// Wants `element` in `set` once more; writes it when it is new or replaces another value.
    fn want(&mut self, refs: &mut ElementRefs, set: &str, element: &str) {
        let slot = refs
            .entry((set.to_owned(), element_key(element).to_owned()))
            .or_insert_with(|| (String::new(), 0));
        let p = &self.prefix;
        if slot.1 > 0 && slot.0 == element {
            slot.1 += 1;
            return;
        }
        if slot.1 > 0 {
            let _ = writeln!(
                self.out,
                "delete element {p} {set} {{ {} }}",
                element_key(&slot.0)
            );
        }
        *slot = (element.to_owned(), 1);
        let _ = writeln!(self.out, "add element {p} {set} {{ {element} }}");
    }

    /// Wants `element` in `set` once less; deletes it when nobody wants it any more.
    fn unwant(&mut self, refs: &mut ElementRefs, set: &str, element: &str) {
        let key = (set.to_owned(), element_key(element).to_owned());
        let Some(slot) = refs.get_mut(&key) else {
            return;
        };
        if slot.0 != element {
            // Replaced by another owner's value: that one stays.
            return;
        }
        slot.1 -= 1;
        if slot.1 == 0 {
            refs.remove(&key);
            let _ = writeln!(
                self.out,
                "delete element {} {set} {{ {} }}",
                self.prefix, key.1
            );
        }
    }
}

/// A chain and its rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// For a base chain, its spec: `type nat hook prerouting priority dstnat`.
    pub hook: Option<String>,
    /// The rules, in order, in nft syntax without the `add rule <family> <table> <chain>` prefix.
    pub rules: Vec<String>,
}

/// Everything one owner contributes to a table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// Chains by name.
    pub chains: BTreeMap<String, Chain>,
    /// Sets and maps by name, with their declaration body (`type ipv4_addr ; flags timeout ;`).
    /// A set's elements outlive syncs (session affinity entries); a map's do not.
    pub sets: BTreeMap<String, String>,
    /// Elements this owner adds to sets and maps declared by any owner: (set, element).
    pub elements: BTreeSet<(String, String)>,
}

impl Rules {
    /// Adds a chain with its rules.
    pub fn chain(&mut self, name: impl Into<String>, rules: Vec<String>) {
        self.chains.insert(name.into(), Chain { hook: None, rules });
    }

    /// Adds an element to a set or map.
    pub fn element(&mut self, set: &str, element: impl Into<String>) {
        self.elements.insert((set.to_owned(), element.into()));
    }

    /// How many rules, chains and set elements this owner has (for the metrics).
    pub fn counts(&self) -> (usize, usize, usize) {
        let rules = self.chains.values().map(|c| c.rules.len()).sum();
        (rules, self.chains.len(), self.elements.len())
    }
}

/// Builds one nftables transaction for a table.
pub struct Transaction {
    prefix: String,
    out: String,
    deletes: String,
}

impl Transaction {
    /// A transaction on `table` in `family` (`ip` or `ip6`).
    pub fn new(family: &str, table: &str) -> Transaction {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "add table {family} {table} {{ comment \"rules for capstan proxy\" ; }}"
        );
        Transaction {
            prefix: format!("{family} {table}"),
            out,
            deletes: String::new(),
        }
    }

    /// Declares a chain (a rule may jump to a chain only once it is declared).
    fn declare_chain(&mut self, name: &str, chain: &Chain) {
        let p = &self.prefix;
        match &chain.hook {
            Some(hook) => {
                let _ = writeln!(self.out, "add chain {p} {name} {{ {hook} ; }}");
            }
            None => {
                let _ = writeln!(self.out, "add chain {p} {name}");
            }
        }
    }

    /// Empties a declared chain and writes its rules.
    fn fill_chain(&mut self, name: &str, chain: &Chain) {
        let p = &self.prefix;
        let _ = writeln!(self.out, "flush chain {p} {name}");
        for rule in &chain.rules {
            let _ = writeln!(self.out, "add rule {p} {name} {rule}");
        }
    }

    fn declare_set(&mut self, name: &str, body: &str) {
        let kind = if body.contains(" : ") { "map" } else { "set" };
        let _ = writeln!(self.out, "add {kind} {} {name} {{ {body} }}", self.prefix);
    }

    /// Writes every owner in full: each chain flushed and refilled, each map and plain set
    /// emptied and refilled (affinity sets keep their entries), sets `existing` has beyond them
    /// deleted, and chains beyond them emptied and returned (to delete later, as `partial`).
    pub fn full<'r>(
        &mut self,
        owners: impl IntoIterator<Item = &'r Rules> + Clone,
        existing_chains: &BTreeSet<String>,
        existing_sets: &BTreeSet<String>,
        refs: &mut ElementRefs,
        recreate_hooks: bool,
    ) -> Vec<String> {
        let mut wanted_chains = BTreeSet::new();
        let mut wanted_sets = BTreeSet::new();
        for rules in owners.clone() {
            for (name, body) in &rules.sets {
                self.declare_set(name, body);
                wanted_sets.insert(name.clone());
                if body.contains(" : ") || !body.contains("timeout") {
                    let kind = if body.contains(" : ") { "map" } else { "set" };
                    let _ = writeln!(self.out, "flush {kind} {} {name}", self.prefix);
                }
            }
        }
        for rules in owners.clone() {
            for (name, chain) in &rules.chains {
                if let (true, Some(hook)) = (recreate_hooks, &chain.hook) {
                    // A base chain made again takes a changed hook or priority.
                    let p = &self.prefix;
                    let _ = writeln!(self.out, "add chain {p} {name} {{ {hook} ; }}");
                    let _ = writeln!(self.out, "flush chain {p} {name}");
                    let _ = writeln!(self.out, "delete chain {p} {name}");
                }
                self.declare_chain(name, chain);
                wanted_chains.insert(name.clone());
            }
        }
        for rules in owners.clone() {
            for (name, chain) in &rules.chains {
                self.fill_chain(name, chain);
            }
        }
        refs.clear();
        for rules in owners {
            for (set, element) in &rules.elements {
                self.want(refs, set, element);
            }
        }
        let mut stale = Vec::new();
        for name in existing_chains.difference(&wanted_chains) {
            let _ = writeln!(self.out, "flush chain {} {name}", self.prefix);
            stale.push(name.clone());
        }
        for name in existing_sets.difference(&wanted_sets) {
            let _ = writeln!(self.deletes, "delete set {} {name}", self.prefix);
        }
        stale
    }

    /// Writes what changed from `old` to `new` for one owner. Chains the owner no longer has
    /// are emptied and returned: they are deleted by a later transaction, once nothing points
    /// at them (kernels before 6.2 see a chain unreferenced only a moment after its map
    /// element goes).
    pub fn partial(&mut self, old: &Rules, new: &Rules, refs: &mut ElementRefs) -> Vec<String> {
        let mut rewrite_all = false;
        for (name, body) in &new.sets {
            if old.sets.get(name) == Some(body) {
                continue;
            }
            if old.sets.contains_key(name) {
                // A changed declaration (a new affinity timeout) needs the set made again, and
                // nothing may point at it while it goes: only this owner's chains do.
                for chain in old.chains.keys() {
                    let _ = writeln!(self.out, "flush chain {} {chain}", self.prefix);
                }
                let _ = writeln!(self.out, "delete set {} {name}", self.prefix);
                rewrite_all = true;
            }
            self.declare_set(name, body);
        }
        let changed: Vec<(&String, &Chain)> = new
            .chains
            .iter()
            .filter(|(name, chain)| rewrite_all || old.chains.get(*name) != Some(*chain))
            .collect();
        for (name, chain) in &changed {
            self.declare_chain(name, chain);
        }
        for (name, chain) in changed {
            self.fill_chain(name, chain);
        }
        for (set, element) in old.elements.difference(&new.elements) {
            self.unwant(refs, set, element);
        }
        for (set, element) in new.elements.difference(&old.elements) {
            self.want(refs, set, element);
        }
        let mut stale = Vec::new();
        for name in old.chains.keys().filter(|n| !new.chains.contains_key(*n)) {
            let _ = writeln!(self.out, "flush chain {} {name}", self.prefix);
            stale.push(name.clone());
        }
        for name in old.sets.keys().filter(|n| !new.sets.contains_key(*n)) {
            let _ = writeln!(self.deletes, "delete set {} {name}", self.prefix);
        }
        stale
    }

    /// Declares an owner's sets and writes all its chains again.
    pub fn rewrite(&mut self, rules: &Rules) {
        for (name, body) in &rules.sets {
            self.declare_set(name, body);
        }
        for (name, chain) in &rules.chains {
            self.declare_chain(name, chain);
        }
        for (name, chain) in &rules.chains {
            self.fill_chain(name, chain);
        }
    }

    /// Empties a chain (to delete it later).
    pub fn flush_chain(&mut self, name: &str) {
        let _ = writeln!(self.out, "flush chain {} {name}", self.prefix);
    }

    /// Deletes chains emptied by an earlier transaction.
    pub fn delete_chains<'n>(&mut self, names: impl IntoIterator<Item = &'n String>) {
        for name in names {
            let _ = writeln!(self.out, "delete chain {} {name}", self.prefix);
        }
    }

    /// The transaction's text: additions and rewrites first, then what goes (so nothing is
    /// deleted while a rule or map element still points at it).
    pub fn finish(self) -> String {
        let mut out = self.out;
        out.push_str(&self.deletes);
        out
    }
}
