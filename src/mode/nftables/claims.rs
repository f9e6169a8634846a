//! The renderer's claims: for every element key in a set, the service ports
//! that put an element there, the first of which is in the kernel.
//!
//! A table of [`Claims`] hashed on the key of their own first element, so the
//! key is held once, in the element, not again as the table's key.

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;
use kube_nlproxy_netlink::nft::{Element, KeyValue};
use smallvec::SmallVec;

use super::SetId;
use crate::model::ServicePortName;

/// How much of an element's key two service ports compete for in a set: an
/// entry point's class is one claim whatever its count and timeout (the first
/// claimer in name order decides where the entry point's traffic goes); every
/// other element is its own key.
pub(super) fn claim_key(set: SetId, key: &[KeyValue]) -> &[KeyValue] {
    let keep = match set {
        SetId::Classes(_) => key.len().saturating_sub(2),
        SetId::AffinityTimeouts => key.len().saturating_sub(1),
        _ => key.len(),
    };
    &key[..keep]
}

/// The claims on one element key: by service port, in name order. The first one
/// is in the kernel. Never empty while in a [`ClaimsTable`].
///
/// Almost every key has one claim, so this is a short sorted vector (a `BTreeMap`
/// would allocate a whole node of eleven entries per key).
#[derive(Debug, Clone)]
pub(super) struct Claims {
    set: SetId,
    /// In name order. One claim is the rule: it is kept inline, so a key costs
    /// no allocation of its own (the bucket is as big as with a `Vec`).
    claims: SmallVec<[(Arc<ServicePortName>, Arc<Element>); 1]>,
}

impl Claims {
    /// The set the key is in.
    pub(super) fn set(&self) -> SetId {
        self.set
    }

    /// The element in the kernel: the first claimer's.
    pub(super) fn first(&self) -> Option<&Arc<Element>> {
        self.claims.first().map(|(_, e)| e)
    }

    /// A claimer other than `name`.
    pub(super) fn other_than(&self, name: &ServicePortName) -> Option<&ServicePortName> {
        self.claims.iter().map(|(n, _)| &**n).find(|n| *n != name)
    }

    /// The key all the claims are on.
    fn key(&self) -> &[KeyValue] {
        self.first()
            .map_or(&[][..], |e| claim_key(self.set, &e.key))
    }

    fn insert(&mut self, name: Arc<ServicePortName>, element: Arc<Element>) {
        match self.claims.binary_search_by(|(n, _)| (**n).cmp(&*name)) {
            Ok(i) => self.claims[i].1 = element,
            Err(i) => {
                // A second claim spills to the heap: room for exactly it.
                self.claims.reserve_exact(1);
                self.claims.insert(i, (name, element))
            }
        }
    }

    fn remove(&mut self, name: &ServicePortName) {
        if let Ok(i) = self.claims.binary_search_by(|(n, _)| (**n).cmp(name)) {
            self.claims.remove(i);
        }
    }
}

/// Every element key's claims.
#[derive(Debug, Clone, Default)]
pub(super) struct ClaimsTable {
    table: HashTable<Claims>,
    hasher: foldhash::fast::RandomState,
}

impl ClaimsTable {
    fn hash(&self, set: SetId, key: &[KeyValue]) -> u64 {
        self.hasher.hash_one((set, key))
    }

    /// Number of claimed keys.
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key is claimed.
    pub(super) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Makes room for `additional` more keys at once.
    pub(super) fn reserve(&mut self, additional: usize) {
        let hasher = &self.hasher;
        self.table
            .reserve(additional, |c| hasher.hash_one((c.set, c.key())));
    }

    /// Every claimed key's claims, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Claims> {
        self.table.iter()
    }

    /// The claims on `key` in `set` (a key as [`claim_key`] cuts it).
    pub(super) fn get(&self, set: SetId, key: &[KeyValue]) -> Option<&Claims> {
        self.table
            .find(self.hash(set, key), |c| c.set == set && c.key() == key)
    }

    /// `name` claims `element` in `set`; returns the key's claims now.
    pub(super) fn claim(
        &mut self,
        set: SetId,
        name: Arc<ServicePortName>,
        element: Arc<Element>,
    ) -> &Claims {
        let key = claim_key(set, &element.key);
        let hash = self.hash(set, key);
        let hasher = &self.hasher;
        let entry = self.table.entry(
            hash,
            |c| c.set == set && c.key() == key,
            |c| hasher.hash_one((c.set, c.key())),
        );
        match entry {
            hashbrown::hash_table::Entry::Occupied(o) => {
                let claims = o.into_mut();
                claims.insert(name, element);
                claims
            }
            hashbrown::hash_table::Entry::Vacant(v) => {
                let claims = smallvec::smallvec![(name, element)];
                v.insert(Claims { set, claims }).into_mut()
            }
        }
    }

    /// `name` no longer claims the key of `element` in `set`.
    pub(super) fn withdraw(&mut self, set: SetId, element: &[KeyValue], name: &ServicePortName) {
        let key = claim_key(set, element);
        let hash = self.hash(set, key);
        if let Ok(mut entry) = self
            .table
            .find_entry(hash, |c| c.set == set && c.key() == key)
        {
            entry.get_mut().remove(name);
            if entry.get().claims.is_empty() {
                entry.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    fn port(name: &str) -> Arc<ServicePortName> {
        Arc::new(ServicePortName {
            namespace: "ns".into(),
            name: name.into(),
            port_name: "".into(),
            protocol: Protocol::Tcp,
        })
    }

    fn element(key: &[KeyValue]) -> Arc<Element> {
        Arc::new(Element::new(key.to_vec()))
    }

    #[test]
    fn the_first_claimer_in_name_order_holds_the_key_until_it_withdraws() {
        let mut t = ClaimsTable::default();
        let key = [KeyValue::Port(80), KeyValue::Proto(6)];
        let (a, b) = (port("a"), port("b"));
        let (ea, eb) = (element(&key), element(&key));
        t.claim(SetId::Hairpin, b.clone(), eb.clone());
        let claims = t.claim(SetId::Hairpin, a.clone(), ea.clone());
        assert!(Arc::ptr_eq(claims.first().unwrap(), &ea));
        assert_eq!(claims.other_than(&a), Some(&*b));
        assert_eq!(t.len(), 1);
        // The same key in another set is another claim.
        t.claim(SetId::ClusterIps, a.clone(), element(&key));
        assert_eq!(t.len(), 2);
        t.withdraw(SetId::Hairpin, &key, &a);
        let claims = t
            .get(SetId::Hairpin, claim_key(SetId::Hairpin, &key))
            .unwrap();
        assert!(Arc::ptr_eq(claims.first().unwrap(), &eb));
        t.withdraw(SetId::Hairpin, &key, &b);
        assert!(t.get(SetId::Hairpin, &key).is_none());
        assert_eq!(t.len(), 1);
        // Withdrawing what nobody claims changes nothing.
        t.withdraw(SetId::Hairpin, &key, &b);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_class_is_claimed_by_its_entry_point_whatever_its_count() {
        let mut t = ClaimsTable::default();
        let entry = [
            KeyValue::Addr("10.0.0.1".parse().unwrap()),
            KeyValue::Proto(6),
            KeyValue::Port(80),
        ];
        let with = |count: u32, timeout: u32| {
            let mut key = entry.to_vec();
            key.extend([KeyValue::Mark(count), KeyValue::Mark(timeout)]);
            key
        };
        let set = SetId::Classes(super::super::Entry::Main(super::super::EntryKind::Ips));
        t.claim(set, port("a"), element(&with(2, 0)));
        t.claim(set, port("b"), element(&with(3, 10)));
        assert_eq!(t.len(), 1);
        let claims = t.get(set, claim_key(set, &with(9, 9))).unwrap();
        assert_eq!(claims.first().unwrap().key, with(2, 0));
    }
}
