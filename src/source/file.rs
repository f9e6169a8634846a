//! File source: a YAML/JSON file or a directory of them, multi-document, holding
//! Services, EndpointSlices, Nodes, ServiceCIDRs and `List`s of those (what
//! `kubectl get -o yaml` prints).
//!
//! Hostile input is expected: nothing in a file can make the load fail, hang or grow
//! memory without bound. A file larger than [`MAX_FILE_BYTES`] is refused; every
//! document is parsed under a [`serde_saphyr::Budget`] (depth, nodes, aliases, scalar
//! bytes); a syntax error or an exceeded limit ends that file with one warning and
//! keeps the documents before it; a bad object is skipped with a warning naming the
//! object and the field.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::de::DeserializeOwned;

pub use super::Objects;

/// Files larger than this are refused with a warning (64 MiB: a 50 MB dump of a large
/// cluster still loads). Nothing is read beyond it, even from a file that grows.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// At most this many warnings are kept per file; one more line counts the rest, so a
/// file of a million bad documents cannot fill memory with warnings.
pub const MAX_WARNINGS_PER_FILE: usize = 100;

/// Errors loading a file source. One bad document is a warning, not an error; these
/// are for paths that cannot be read at all.
#[derive(Debug, thiserror::Error)]
pub enum FileSourceError {
    /// `stat` of the path failed.
    #[error("file source: stat {path}: {source}")]
    Stat {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Listing the directory failed.
    #[error("file source: list directory {path}: {source}")]
    ListDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Reading a file failed.
    #[error("file source: read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The YAML parser's limits for one document of a manifest file.
///
/// Budgets apply per document (the streaming reader resets them at each `---`), so a
/// file of many small documents is bounded only by [`MAX_FILE_BYTES`], while one
/// document is refused before its parsed nodes reach a few hundred MiB:
/// - `max_depth` 64: API objects nest about 12 deep (managedFields included); this
///   also bounds the recursion of every later step (conversion, drop).
/// - `max_nodes` 2M / `max_events` 4M: a `kind: List` of 10k Services as `kubectl get
///   -o yaml` prints them (managedFields included) is about 1.3M nodes. The costliest
///   shape, one mapping of 1M short entries (2M nodes), peaks at ~350 MiB.
/// - aliases: manifests use a handful (shared labels); 10k aliases, 1k anchors and
///   100k replayed events per document stop a "billion laughs" after a few MiB,
///   with alias replay nested at most 16 deep.
/// - scalar bytes: the whole file limit; a key may be looked ahead 4 KiB (label keys
///   are at most 317 characters).
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_reader_input_bytes: Some(MAX_FILE_BYTES as usize),
            max_depth: 64,
            flow_nesting_limit: 64,
            max_nodes: 2_000_000,
            max_events: 4_000_000,
            max_aliases: 10_000,
            max_anchors: 1_000,
            max_merge_keys: 1_000,
            max_total_scalar_bytes: MAX_FILE_BYTES as usize,
            simple_key_max_lookahead: 4096,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 100_000,
            max_replay_stack_depth: 16,
        },
        // YAML 1.2 booleans only: `on`/`yes` stay strings, as with serde_yaml before.
        strict_booleans: true,
        // Warnings are one line each; the location is in the message.
        with_snippet: false,
    }
}

/// One parsed YAML node. Mappings keep the order and the keys of the text, so a
/// document can be inspected (kind, name) before it is converted to its API type.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    String(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Node {
    /// The value of `key` in a mapping.
    pub(super) fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Node::String(s) => Some(s),
            _ => None,
        }
    }

    /// Removes `key` from a mapping and returns its value.
    fn take(&mut self, key: &str) -> Option<Node> {
        match self {
            Node::Map(entries) => {
                let i = entries.iter().position(|(k, _)| k == key)?;
                Some(entries.remove(i).1)
            }
            _ => None,
        }
    }

    fn unexpected(&self) -> serde::de::Unexpected<'_> {
        use serde::de::Unexpected;
        match self {
            Node::Null => Unexpected::Unit,
            Node::Bool(b) => Unexpected::Bool(*b),
            Node::Int(i) => Unexpected::Signed(*i),
            Node::UInt(u) => Unexpected::Unsigned(*u),
            Node::Float(f) => Unexpected::Float(*f),
            Node::String(s) => Unexpected::Str(s),
            Node::Seq(_) => Unexpected::Seq,
            Node::Map(_) => Unexpected::Map,
        }
    }
}

impl<'de> serde::Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        struct NodeVisitor;
        impl<'de> serde::de::Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E>(self, b: bool) -> Result<Node, E> {
                Ok(Node::Bool(b))
            }
            fn visit_i64<E>(self, i: i64) -> Result<Node, E> {
                Ok(Node::Int(i))
            }
            fn visit_u64<E>(self, u: u64) -> Result<Node, E> {
                Ok(Node::UInt(u))
            }
            fn visit_f64<E>(self, f: f64) -> Result<Node, E> {
                Ok(Node::Float(f))
            }
            fn visit_str<E>(self, s: &str) -> Result<Node, E> {
                Ok(Node::String(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<Node, E> {
                Ok(Node::String(s))
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                <Node as serde::Deserialize>::deserialize(d)
            }
            fn visit_newtype_struct<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Node, D::Error> {
                <Node as serde::Deserialize>::deserialize(d)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Node>()? {
                    entries.push(entry);
                }
                Ok(Node::Map(entries))
            }
        }
        d.deserialize_any(NodeVisitor)
    }
}

/// Why a [`Node`] did not convert into its API type, and where (`spec.ports[0].port`).
#[derive(Debug)]
struct ConvertError {
    /// Innermost first.
    path: Vec<PathSegment>,
    message: String,
}

#[derive(Debug)]
enum PathSegment {
    Key(String),
    Index(usize),
}

impl ConvertError {
    fn within(mut self, segment: PathSegment) -> Self {
        self.path.push(segment);
        self
    }
}

impl std::fmt::Display for ConvertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, segment) in self.path.iter().rev().enumerate() {
            match segment {
                PathSegment::Index(n) => write!(f, "[{n}]")?,
                PathSegment::Key(k) if k.contains(['.', '/', ' ', '[', ']']) => write!(f, "[{k}]")?,
                PathSegment::Key(k) if i == 0 => f.write_str(k)?,
                PathSegment::Key(k) => write!(f, ".{k}")?,
            }
        }
        if !self.path.is_empty() {
            f.write_str(": ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConvertError {}

impl serde::de::Error for ConvertError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        ConvertError {
            path: Vec::new(),
            message: msg.to_string(),
        }
    }
}

/// A [`Node`] as a serde `Deserializer`; errors carry the path of the failing field.
struct NodeDeserializer<'a>(&'a Node);

impl<'de> serde::Deserializer<'de> for NodeDeserializer<'de> {
    type Error = ConvertError;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, v: V) -> Result<V::Value, ConvertError> {
        match self.0 {
            Node::Null => v.visit_unit(),
            Node::Bool(b) => v.visit_bool(*b),
            Node::Int(i) => v.visit_i64(*i),
            Node::UInt(u) => v.visit_u64(*u),
            Node::Float(f) => v.visit_f64(*f),
            Node::String(s) => v.visit_borrowed_str(s),
            Node::Seq(items) => {
                let mut seq = SeqDeserializer {
                    items: items.iter().enumerate(),
                };
                let value = v.visit_seq(&mut seq)?;
                match seq.items.len() {
                    0 => Ok(value),
                    left => Err(serde::de::Error::invalid_length(
                        items.len(),
                        &format!("{} elements", items.len() - left).as_str(),
                    )),
                }
            }
            Node::Map(entries) => v.visit_map(MapDeserializer {
                entries: entries.iter(),
                value: None,
            }),
        }
    }

    fn deserialize_option<V: serde::de::Visitor<'de>>(
        self,
        v: V,
    ) -> Result<V::Value, ConvertError> {
        match self.0 {
            Node::Null => v.visit_none(),
            _ => v.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, ConvertError> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, ConvertError> {
        match self.0 {
            Node::String(s) => v.visit_enum(serde::de::value::BorrowedStrDeserializer::new(s)),
            Node::Map(entries) if entries.len() == 1 => v.visit_enum(EnumDeserializer {
                variant: &entries[0].0,
                value: &entries[0].1,
            }),
            other => Err(serde::de::Error::invalid_type(
                other.unexpected(),
                &"a variant name or a mapping with one key",
            )),
        }
    }

    fn deserialize_ignored_any<V: serde::de::Visitor<'de>>(
        self,
        v: V,
    ) -> Result<V::Value, ConvertError> {
        v.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

struct SeqDeserializer<'a> {
    items: std::iter::Enumerate<std::slice::Iter<'a, Node>>,
}

impl<'de> serde::de::SeqAccess<'de> for SeqDeserializer<'de> {
    type Error = ConvertError;

    fn next_element_seed<T: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, ConvertError> {
        match self.items.next() {
            None => Ok(None),
            Some((i, item)) => seed
                .deserialize(NodeDeserializer(item))
                .map(Some)
                .map_err(|e| e.within(PathSegment::Index(i))),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct MapDeserializer<'a> {
    entries: std::slice::Iter<'a, (String, Node)>,
    value: Option<(&'a str, &'a Node)>,
}

impl<'de> serde::de::MapAccess<'de> for MapDeserializer<'de> {
    type Error = ConvertError;

    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, ConvertError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some((key, value));
        seed.deserialize(serde::de::value::BorrowedStrDeserializer::new(key))
            .map(Some)
            .map_err(|e: ConvertError| e.within(PathSegment::Key(key.clone())))
    }

    fn next_value_seed<V: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, ConvertError> {
        let (key, value) = self
            .value
            .take()
            .ok_or_else(|| serde::de::Error::custom("map value requested before its key"))?;
        seed.deserialize(NodeDeserializer(value))
            .map_err(|e| e.within(PathSegment::Key(key.to_owned())))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

struct EnumDeserializer<'a> {
    variant: &'a str,
    value: &'a Node,
}

impl<'de> serde::de::EnumAccess<'de> for EnumDeserializer<'de> {
    type Error = ConvertError;
    type Variant = VariantDeserializer<'de>;

    fn variant_seed<T: serde::de::DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<(T::Value, Self::Variant), ConvertError> {
        let variant =
            seed.deserialize(serde::de::value::BorrowedStrDeserializer::new(self.variant))?;
        Ok((
            variant,
            VariantDeserializer {
                name: self.variant,
                value: self.value,
            },
        ))
    }
}

struct VariantDeserializer<'a> {
    name: &'a str,
    value: &'a Node,
}

impl VariantDeserializer<'_> {
    fn within(&self, e: ConvertError) -> ConvertError {
        e.within(PathSegment::Key(self.name.to_owned()))
    }
}

impl<'de> serde::de::VariantAccess<'de> for VariantDeserializer<'de> {
    type Error = ConvertError;

    fn unit_variant(self) -> Result<(), ConvertError> {
        match self.value {
            Node::Null => Ok(()),
            other => Err(self.within(serde::de::Error::invalid_type(
                other.unexpected(),
                &"a unit variant",
            ))),
        }
    }

    fn newtype_variant_seed<T: serde::de::DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, ConvertError> {
        seed.deserialize(NodeDeserializer(self.value))
            .map_err(|e| self.within(e))
    }

    fn tuple_variant<V: serde::de::Visitor<'de>>(
        self,
        _len: usize,
        v: V,
    ) -> Result<V::Value, ConvertError> {
        serde::Deserializer::deserialize_seq(NodeDeserializer(self.value), v)
            .map_err(|e| self.within(e))
    }

    fn struct_variant<V: serde::de::Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, ConvertError> {
        serde::Deserializer::deserialize_map(NodeDeserializer(self.value), v)
            .map_err(|e| self.within(e))
    }
}

/// `kind namespace/name` of a raw object, as far as it is readable.
fn describe(value: &Node) -> String {
    let kind = value
        .get("kind")
        .and_then(Node::as_str)
        .unwrap_or("<no kind>");
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Node::as_str)
        .unwrap_or("<no name>");
    match meta.and_then(|m| m.get("namespace")).and_then(Node::as_str) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Deserialize a raw node into `T`; the error names the field path.
pub(super) fn convert<T: DeserializeOwned>(value: &Node) -> Result<T, String> {
    T::deserialize(NodeDeserializer(value)).map_err(|e| e.to_string())
}

/// What one file contributes: its objects, and warnings capped at
/// [`MAX_WARNINGS_PER_FILE`].
struct Loaded<'a> {
    origin: &'a str,
    objects: Objects,
    warnings: Vec<String>,
    suppressed: usize,
}

impl<'a> Loaded<'a> {
    fn new(origin: &'a str) -> Self {
        Loaded {
            origin,
            objects: Objects::default(),
            warnings: Vec::new(),
            suppressed: 0,
        }
    }

    fn warn(&mut self, warning: String) {
        if self.warnings.len() < MAX_WARNINGS_PER_FILE {
            self.warnings.push(warning);
        } else {
            self.suppressed += 1;
        }
    }

    fn finish(mut self) -> (Objects, Vec<String>) {
        if self.suppressed > 0 {
            self.warnings.push(format!(
                "{}: {} more warnings not shown",
                self.origin, self.suppressed
            ));
        }
        (self.objects, self.warnings)
    }

    /// Add one object (not a List); `at` locates it for warnings.
    fn add_object(&mut self, value: Node, at: &str) {
        let api_version = value.get("apiVersion").and_then(Node::as_str).unwrap_or("");
        let kind = value.get("kind").and_then(Node::as_str).unwrap_or("");
        let objects = &mut self.objects;
        let result = match (api_version, kind) {
            ("v1", "Service") => convert(&value).map(|o| objects.services.push(o)),
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                convert(&value).map(|o| objects.endpoint_slices.push(o))
            }
            ("v1", "Node") => convert(&value).map(|o| objects.nodes.push(o)),
            ("networking.k8s.io/v1", "ServiceCIDR") => {
                convert(&value).map(|o| objects.service_cidrs.push(o))
            }
            _ => {
                let what = describe(&value);
                self.warn(format!(
                    "{at}: ignoring unsupported object kind {kind:?} apiVersion {api_version:?} ({what})"
                ));
                return;
            }
        };
        if let Err(e) = result {
            let what = describe(&value);
            self.warn(format!("{at}: skipping invalid {what}: {e}"));
        }
    }

    /// One document: an object or a `*List` of objects.
    fn add_document(&mut self, mut value: Node, at: &str) {
        match value {
            Node::Null => return,
            Node::Map(_) => {}
            _ => {
                self.warn(format!("{at}: ignoring a document that is not an object"));
                return;
            }
        }
        let kind = value.get("kind").and_then(Node::as_str).unwrap_or("");
        if !kind.ends_with("List") {
            self.add_object(value, at);
            return;
        }
        let kind = kind.to_owned();
        let items = match value.take("items") {
            Some(Node::Seq(items)) => items,
            None | Some(Node::Null) => Vec::new(),
            Some(_) => {
                self.warn(format!("{at}: {kind}: items is not a list"));
                return;
            }
        };
        for (i, item) in items.into_iter().enumerate() {
            if item != Node::Null {
                self.add_object(item, &format!("{at}: items[{i}]"));
            }
        }
    }
}

/// Parse multi-document YAML (or JSON) text. `origin` names the text in warnings
/// (normally the file path), with the line of the document. Never fails: a bad
/// object or a document the parser can step over (a duplicate key) is one warning and
/// the other documents still load; a syntax error or an exceeded limit (depth,
/// nodes, aliases) is one warning that ends the text, keeping the documents before.
pub fn parse_manifests(text: &str, origin: &str) -> (Objects, Vec<String>) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let parts = if text.len() >= PARALLEL_PARSE_BYTES && threads > 1 {
        split_documents(text, threads)
    } else {
        Vec::new()
    };
    if parts.len() > 1 {
        let results: Vec<Option<(Loaded<'_>, bool)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = parts
                .iter()
                .map(|&(first_line, part)| {
                    scope.spawn(move || {
                        let mut loaded = Loaded::new(origin);
                        let clean = parse_documents_into(&mut loaded, part, first_line);
                        (loaded, clean)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().ok()).collect()
        });
        // A syntax error's own message counts lines from where its parser
        // started: parse the whole text again so it names the right line.
        if results
            .iter()
            .all(|r| r.as_ref().is_some_and(|(_, clean)| *clean))
        {
            let mut merged = Loaded::new(origin);
            for (loaded, _) in results.into_iter().flatten() {
                merged.objects.extend(loaded.objects);
                for w in loaded.warnings {
                    merged.warn(w);
                }
                merged.suppressed += loaded.suppressed;
            }
            return merged.finish();
        }
    }
    let mut loaded = Loaded::new(origin);
    if parse_documents_into(&mut loaded, text, 0) {
        return loaded.finish();
    }
    let mut loaded = Loaded::new(origin);
    parse_into(&mut loaded, text, 0);
    loaded.finish()
}

/// [`parse_into`], faster: each stretch of `text` between document markers is
/// parsed from the string (the parser reads a `&str` some 25% faster than a
/// reader). Any error returns `false`, and the caller starts over with
/// [`parse_into`] on the whole text, so that what is skipped, where a syntax
/// error stops and the lines named are exactly that parser's (bad input
/// costs a second parse; good input is parsed once).
fn parse_documents_into(loaded: &mut Loaded<'_>, text: &str, first_line: usize) -> bool {
    if text.starts_with('%') || text.contains("\n%") {
        // Directives belong to the document after them: no stretches.
        return parse_into(loaded, text, first_line);
    }
    let origin = loaded.origin;
    for (line, stretch) in document_stretches(text) {
        let first_line = first_line + line;
        let parsed = serde_saphyr::from_str_multiple_with_options::<
            serde_saphyr::Spanned<Node>,
            Vec<_>,
        >(stretch, yaml_options());
        match parsed {
            Ok(documents) => {
                for document in documents {
                    let at = match document.referenced.line() {
                        0 => origin.to_owned(),
                        line => format!("{origin}:{}", line as usize + first_line),
                    };
                    loaded.add_document(document.value, &at);
                }
            }
            // Any error: the reader decides what it skips and where it stops.
            Err(_) => return false,
        }
    }
    true
}

/// The stretches of `text` that start at a document marker line (and the
/// first one at the start), each with the number of lines before it.
fn document_stretches(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut rest = text;
    let mut line = 0;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut offset = 0;
        let mut lines = 0;
        for l in rest.split_inclusive('\n') {
            if offset > 0 && is_document_marker(l) {
                break;
            }
            offset += l.len();
            lines += 1;
        }
        let (stretch, after) = rest.split_at(offset);
        let at = line;
        rest = after;
        line += lines;
        Some((at, stretch))
    })
}

/// A line that is a document marker: `---` at its start, then the end of the
/// line or a blank (YAML forbids such a line inside any scalar).
fn is_document_marker(line: &str) -> bool {
    line.starts_with("---")
        && matches!(
            line.as_bytes().get(3),
            None | Some(b' ' | b'\t' | b'\r' | b'\n')
        )
}

/// Texts at least this big are parsed on several threads, split between
/// documents (the YAML parser does some 5 MB/s; 10k Services with their
/// EndpointSlices are about 5.6 MB).
const PARALLEL_PARSE_BYTES: usize = 512 << 10;

/// Parses the documents of `text` into `loaded`; `first_line` is the line of
/// the whole file `text` starts at. Returns whether the YAML was well formed.
fn parse_into(loaded: &mut Loaded<'_>, text: &str, first_line: usize) -> bool {
    let origin = loaded.origin;
    let mut input = text.as_bytes();
    let documents = serde_saphyr::read_with_options::<_, serde_saphyr::Spanned<Node>>(
        &mut input,
        yaml_options(),
    );
    let mut last_error = None;
    let mut clean = true;
    // Every document or error consumes input, so there are fewer than `len + 2` of
    // them; the bound makes a parser that repeats itself (as serde_yaml did after a
    // syntax error) harmless.
    for document in documents.take(text.len() + 2) {
        match document {
            Ok(document) => {
                let at = match document.referenced.line() {
                    0 => origin.to_owned(),
                    line => format!("{origin}:{}", line as usize + first_line),
                };
                loaded.add_document(document.value, &at);
            }
            Err(e) => {
                clean = false;
                let location = e.location();
                if location.is_some() && location == last_error {
                    break;
                }
                loaded.warn(format!("{origin}: invalid YAML: {e}"));
                last_error = location;
            }
        }
    }
    clean
}

/// Splits `text` into at most `parts` pieces of whole documents, cut where a
/// line is a document marker (`---` at the start of a line, which YAML
/// forbids inside any scalar), each with the number of lines before it. A
/// text with directives (`%YAML`, `%TAG`: they belong to the next document)
/// is not split.
fn split_documents(text: &str, parts: usize) -> Vec<(usize, &str)> {
    if text.starts_with('%') || text.contains("\n%") {
        return vec![(0, text)];
    }
    let target = text.len() / parts.max(1);
    let mut out = Vec::new();
    let (mut start, mut start_line, mut line) = (0, 0, 0);
    let mut offset = 0;
    for l in text.split_inclusive('\n') {
        if is_document_marker(l) && offset - start >= target && out.len() + 1 < parts {
            out.push((start_line, &text[start..offset]));
            start = offset;
            start_line = line;
        }
        offset += l.len();
        line += 1;
    }
    out.push((start_line, &text[start..]));
    out
}

fn is_manifest_name(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext_ok = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    );
    !hidden && ext_ok
}

/// The files a path stands for: the file itself, or the sorted `*.yaml`, `*.yml`,
/// `*.json` files of a directory (non-recursive, hidden files skipped).
pub fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, FileSourceError> {
    let meta = std::fs::metadata(path).map_err(|source| FileSourceError::Stat {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let list_err = |source| FileSourceError::ListDir {
        path: path.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(list_err)? {
        let entry = entry.map_err(list_err)?;
        let p = entry.path();
        if is_manifest_name(&p) && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// The text of one manifest file, or `None` with a warning when it is larger than
/// [`MAX_FILE_BYTES`] or not UTF-8. At most `MAX_FILE_BYTES + 1` bytes are read.
fn read_manifest(
    file: &Path,
    warnings: &mut Vec<String>,
) -> Result<Option<String>, FileSourceError> {
    let read_err = |source| FileSourceError::Read {
        path: file.to_owned(),
        source,
    };
    let too_large = |warnings: &mut Vec<String>| {
        warnings.push(format!(
            "{}: larger than {} MiB, file ignored",
            file.display(),
            MAX_FILE_BYTES >> 20
        ));
    };
    let f = std::fs::File::open(file).map_err(read_err)?;
    let len = f.metadata().map_err(read_err)?.len();
    if len > MAX_FILE_BYTES {
        too_large(warnings);
        return Ok(None);
    }
    // The length only sizes the buffer: a growing file or a device is cut by `take`.
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        too_large(warnings);
        return Ok(None);
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Some(text)),
        Err(e) => {
            warnings.push(format!(
                "{}: not UTF-8 text (invalid byte at offset {}), file ignored",
                file.display(),
                e.utf8_error().valid_up_to()
            ));
            Ok(None)
        }
    }
}

/// Load a file, or a directory of manifest files. Returns the objects and the
/// warnings about files and documents that were skipped; a file that cannot be read
/// at all is an error, so a caller keeps what it had.
pub fn load_path(path: &Path) -> Result<(Objects, Vec<String>), FileSourceError> {
    let mut objects = Objects::default();
    let mut warnings = Vec::new();
    for file in manifest_files(path)? {
        let Some(text) = read_manifest(&file, &mut warnings)? else {
            continue;
        };
        let (o, w) = parse_manifests(&text, &file.display().to_string());
        objects.extend(o);
        warnings.extend(w);
    }
    Ok((objects, warnings))
}

/// Cheap change detection for polling: (path, mtime, length) of every manifest file.
/// Compare two fingerprints; any difference (including added/removed files) means
/// the source must be reloaded.
pub fn fingerprint(path: &Path) -> std::io::Result<Vec<(PathBuf, SystemTime, u64)>> {
    let files = manifest_files(path).map_err(|e| match e {
        FileSourceError::Stat { source, .. }
        | FileSourceError::ListDir { source, .. }
        | FileSourceError::Read { source, .. } => source,
    })?;
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let meta = std::fs::metadata(&f)?;
        out.push((f, meta.modified()?, meta.len()));
    }
    Ok(out)
}

/// How often a reload that keeps failing the same way is logged again.
const RELOAD_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// The file source as an event source: a task polls the path, reloads it when it
/// changes, logs the warnings of each new load once, and bumps the generation.
#[derive(Debug, Clone)]
pub struct FileSource {
    objects: std::sync::Arc<std::sync::Mutex<Objects>>,
    generation: tokio::sync::watch::Receiver<u64>,
}

impl FileSource {
    /// Loads `path` once (an unreadable path is an error), then follows it every
    /// `poll` on the current tokio runtime.
    pub fn start(path: PathBuf, poll: std::time::Duration) -> Result<FileSource, FileSourceError> {
        let mut seen = fingerprint(&path).ok();
        let (objects, warnings) = load_path(&path)?;
        for w in &warnings {
            tracing::warn!("{w}");
        }
        let objects = std::sync::Arc::new(std::sync::Mutex::new(objects));
        let (tx, rx) = tokio::sync::watch::channel(1u64);
        let shared = objects.clone();
        tokio::spawn(async move {
            // A failing reload (a directory that has gone, a file being written)
            // is logged when it starts or changes, then once a minute.
            let mut failing: Option<(String, std::time::Instant)> = None;
            loop {
                tokio::time::sleep(poll).await;
                let now = fingerprint(&path).ok();
                if now == seen {
                    continue;
                }
                match load_path(&path) {
                    Ok((o, warnings)) => {
                        for w in &warnings {
                            tracing::warn!("{w}");
                        }
                        if failing.take().is_some() {
                            tracing::info!("reloading {}: ok again", path.display());
                        }
                        *shared.lock().expect("file source lock") = o;
                        seen = now;
                        if tx.is_closed() {
                            return;
                        }
                        tx.send_modify(|generation| *generation += 1);
                    }
                    // Keep the last good objects; try again next poll.
                    Err(e) => {
                        let text = crate::ErrorChain(&e).to_string();
                        let repeat = failing.as_ref().is_some_and(|(last, at)| {
                            *last == text && at.elapsed() < RELOAD_WARNING_EVERY
                        });
                        if !repeat {
                            tracing::warn!(
                                "reloading {}: {text} (the last good objects stay; retried \
                                 every {poll:?}, logged again in {RELOAD_WARNING_EVERY:?})",
                                path.display()
                            );
                            failing = Some((text, std::time::Instant::now()));
                        }
                    }
                }
            }
        });
        Ok(FileSource {
            objects,
            generation: rx,
        })
    }
}

impl super::ObjectSource for FileSource {
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.clone()
    }

    fn snapshot(&self) -> Objects {
        self.objects.lock().expect("file source lock").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A text big enough to be parsed on several threads: `MIXED` over and
    /// over, every copy's bad Service named apart.
    fn big_mixed() -> String {
        let mut text = String::new();
        let mut i = 0;
        while text.len() < 2 * PARALLEL_PARSE_BYTES {
            text.push_str(&MIXED.replace("name: bad", &format!("name: bad{i}")));
            text.push_str("---\n");
            i += 1;
        }
        text
    }

    #[test]
    fn a_big_text_parses_on_threads_exactly_as_in_one_go() {
        let text = big_mixed();
        let parts = split_documents(&text, 4);
        assert_eq!(parts.len(), 4);
        assert_eq!(
            parts.iter().map(|(_, p)| p.len()).sum::<usize>(),
            text.len()
        );
        for (first_line, part) in &parts {
            assert!(part.is_empty() || *first_line == 0 || part.starts_with("---"));
            assert_eq!(
                text[..text.find(part).unwrap()].matches('\n').count(),
                *first_line
            );
        }
        let (objects, warnings) = parse_manifests(&text, "big.yaml");
        let mut one = Loaded::new("big.yaml");
        assert!(parse_into(&mut one, &text, 0));
        let (want_objects, want_warnings) = one.finish();
        assert_eq!(objects.services, want_objects.services);
        assert_eq!(objects.endpoint_slices, want_objects.endpoint_slices);
        assert!(!objects.services.is_empty());
        assert_eq!(warnings, want_warnings);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("more warnings not shown"))
        );

        // A syntax error anywhere: the whole text again, one parser, lines right.
        let mut valid = String::new();
        while valid.len() < 2 * PARALLEL_PARSE_BYTES {
            valid.push_str(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: s{}, namespace: default}}\nspec: {{clusterIP: 10.0.0.1, ports: [{{port: 80}}]}}\n---\n",
                valid.len()
            ));
        }
        let broken = format!("{valid}just: a\nrandom: [document\n");
        let (_, warnings) = parse_manifests(&broken, "big.yaml");
        let line = broken.matches('\n').count();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("invalid YAML") && w.contains(&format!("line {line}"))),
            "{:?}",
            warnings
                .iter()
                .filter(|w| w.contains("invalid"))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn document_stretches_parse_exactly_as_the_reader() {
        let node = |n: &str| format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {n}}}\n");
        let texts = [
            MIXED.to_string(),
            format!("{}...\n{}", node("a"), node("b")),
            format!(
                "# comment\n--- {{apiVersion: v1, kind: Node, metadata: {{name: x}}}}\n---\n{}",
                node("y")
            ),
            format!("{}---\na: 1\na: 2\n---\n{}", node("a"), node("b")),
            format!("{}---\n---\n\n---\n", node("a")),
            format!("{}----\n{}", node("a"), node("b")),
            "---".to_string(),
            String::new(),
            format!(
                "kind: NodeList\napiVersion: v1\nitems:\n- {}",
                node("l").replace('\n', "\n  ")
            ),
        ];
        for text in &texts {
            let mut reader = Loaded::new("t.yaml");
            let clean = parse_into(&mut reader, text, 0);
            let (reader, reader_warnings) = reader.finish();
            let mut fast = Loaded::new("t.yaml");
            // Clean text takes the fast path; the rest is parsed again.
            assert_eq!(parse_documents_into(&mut fast, text, 0), clean, "{text:?}");
            let (fast, fast_warnings) = parse_manifests(text, "t.yaml");
            assert_eq!(fast.nodes, reader.nodes, "{text:?}");
            assert_eq!(fast.services, reader.services, "{text:?}");
            assert_eq!(fast.endpoint_slices, reader.endpoint_slices, "{text:?}");
            assert_eq!(fast_warnings, reader_warnings, "{text:?}");
        }
    }

    const MIXED: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: a, namespace: default}
spec:
  clusterIP: 10.0.0.1
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: default}
spec:
  ports: [{port: "eighty"}]
---
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: a-1
  namespace: default
  labels: {kubernetes.io/service-name: a}
addressType: IPv4
endpoints: [{addresses: [10.1.0.1]}]
ports: [{port: 8080}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.0.0.0/16]}
"#;

    #[test]
    fn mixed_documents_bad_one_skipped() {
        let (o, w) = parse_manifests(MIXED, "test.yaml");
        assert_eq!(o.services.len(), 1);
        assert_eq!(o.services[0].metadata.name.as_deref(), Some("a"));
        assert_eq!(o.endpoint_slices.len(), 1);
        assert_eq!(o.nodes.len(), 1);
        assert_eq!(o.service_cidrs.len(), 1);
        assert_eq!(w.len(), 2, "{w:?}");
        let bad = w
            .iter()
            .find(|w| w.contains("Service default/bad"))
            .unwrap();
        assert!(bad.contains("test.yaml"), "{bad}");
        assert!(bad.contains("spec.ports[0].port"), "{bad}");
        let unknown = w.iter().find(|w| w.contains("Deployment")).unwrap();
        assert!(unknown.contains("test.yaml:26"), "{unknown}");
    }

    #[test]
    fn list_documents() {
        let text = r#"
apiVersion: v1
kind: List
metadata: {resourceVersion: ""}
items:
- apiVersion: v1
  kind: Service
  metadata: {name: a, namespace: ns}
  spec: {clusterIP: 10.0.0.1, ports: [{port: 80, protocol: UDP}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: a-x, namespace: ns, labels: {kubernetes.io/service-name: a}}
  addressType: IPv4
  endpoints: []
- apiVersion: v1
  kind: Service
  metadata: {name: b, namespace: ns}
  spec: {ports: [{port: {}}]}
"#;
        let (o, w) = parse_manifests(text, "l.yaml");
        assert_eq!(o.services.len(), 1);
        assert_eq!(o.endpoint_slices.len(), 1);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("items[2]") && w[0].contains("Service ns/b"),
            "{w:?}"
        );
    }

    #[test]
    fn json_and_empty() {
        let (o, w) = parse_manifests("", "e");
        assert!(o.services.is_empty() && w.is_empty());
        let (o, w) = parse_manifests(
            r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}"#,
            "j.json",
        );
        assert_eq!(o.nodes.len(), 1);
        assert!(w.is_empty());
        // What `kubectl get -o json` prints: a pretty-printed List.
        let list = r#"{
    "apiVersion": "v1",
    "items": [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "a", "namespace": "ns", "labels": {"on": "yes"}},
            "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80, "protocol": "TCP"}]}
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "b", "namespace": "ns"},
            "spec": {"ports": [{"port": 80.5}]}
        }
    ],
    "kind": "List",
    "metadata": {"resourceVersion": ""}
}
"#;
        let (o, w) = parse_manifests(list, "l.json");
        assert_eq!(o.services.len(), 1);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("l.json:1: items[1]: skipping invalid Service ns/b: spec.ports[0].port: invalid type"),
            "{w:?}"
        );
    }

    #[test]
    fn syntax_error_is_one_warning_and_keeps_the_documents_before() {
        let text =
            "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\njust: a\nrandom: [document";
        let (o, w) = parse_manifests(text, "t.yaml");
        assert_eq!(o.nodes.len(), 1);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("t.yaml: invalid YAML: ") && w[0].contains("line 6"),
            "{w:?}"
        );
        for text in [
            "[",
            "{",
            "a: b: c",
            "- a\nb: c",
            "\"unterminated",
            "\t- a",
            "key: 'x\n",
        ] {
            let (_, w) = parse_manifests(text, "t.yaml");
            assert_eq!(w.len(), 1, "{text:?}: {w:?}");
        }
    }

    #[test]
    fn recoverable_errors_skip_one_document() {
        // A duplicate key or a NaN is an error in that document only.
        let node = |n: &str| format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {n}}}\n");
        let text = format!(
            "{}---\na: 1\na: 2\n---\n{}---\nx: .nan\n---\n{}",
            node("a"),
            node("b"),
            node("c")
        );
        let (o, w) = parse_manifests(&text, "t.yaml");
        assert_eq!(o.nodes.len(), 3, "{w:?}");
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("duplicate") && w[0].contains("line 6"),
            "{w:?}"
        );
    }

    #[test]
    fn budgets_stop_alias_bombs_and_deep_nesting() {
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for (prev, next) in ["a", "b", "c", "d", "e", "f", "g"]
            .iter()
            .zip(["b", "c", "d", "e", "f", "g", "h"])
        {
            bomb += &format!(
                "{next}: &{next} [{}]\n",
                vec![format!("*{prev}"); 10].join(", ")
            );
        }
        for text in [
            bomb,
            "[".repeat(1000),
            "a:\n".to_owned() + &"- ".repeat(1000) + "x\n",
        ] {
            let (o, w) = parse_manifests(&text, "t.yaml");
            assert!(o.services.is_empty());
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(w[0].starts_with("t.yaml: invalid YAML: "), "{w:?}");
        }
        // A few aliases, as hand-written manifests use them, are fine.
        let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n  labels: &l {app: s}\nspec:\n  clusterIP: 10.0.0.1\n  selector: *l\n  ports: [{port: 80}]\n";
        let (o, w) = parse_manifests(text, "t.yaml");
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(
            o.services[0]
                .spec
                .as_ref()
                .unwrap()
                .selector
                .as_ref()
                .unwrap()["app"],
            "s"
        );
    }

    #[test]
    fn field_paths_and_yaml_1_2_scalars() {
        let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n  namespace: ns\n  labels: {example.com/tier: 1}\nspec: {ports: [{port: 80}]}\n";
        let (o, w) = parse_manifests(text, "t.yaml");
        assert!(o.services.is_empty());
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("Service ns/s: metadata.labels[example.com/tier]: invalid type: integer `1`, expected a string"),
            "{w:?}"
        );
        let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\nspec: {ports: [{port: 80, name: 1x}]}\n";
        let (_, w) = parse_manifests(text, "t.yaml");
        assert!(w.is_empty(), "{w:?}");
        // `yes`, `on`, `no` are strings (YAML 1.2), as with serde_yaml before.
        let text =
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: n\n  labels: {a: yes, b: on, c: no}\n";
        let (o, w) = parse_manifests(text, "t.yaml");
        assert!(w.is_empty(), "{w:?}");
        let labels = o.nodes[0].metadata.labels.as_ref().unwrap();
        assert_eq!((labels["a"].as_str(), labels["b"].as_str()), ("yes", "on"));
    }

    #[test]
    fn load_directory_sorted_and_fingerprint() {
        let dir = std::env::temp_dir().join(format!("nlproxy-file-src-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let node = |n: &str| format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {n}}}\n");
        std::fs::write(dir.join("b.yaml"), node("b")).unwrap();
        std::fs::write(dir.join("a.yml"), node("a")).unwrap();
        std::fs::write(dir.join(".hidden.yaml"), node("h")).unwrap();
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        let (o, w) = load_path(&dir).unwrap();
        let names: Vec<_> = o
            .nodes
            .iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert!(w.is_empty());
        let f1 = fingerprint(&dir).unwrap();
        assert_eq!(f1.len(), 2);
        std::fs::write(dir.join("c.yaml"), node("c")).unwrap();
        assert_ne!(f1, fingerprint(&dir).unwrap());
        let (o, _) = load_path(&dir.join("c.yaml")).unwrap();
        assert_eq!(o.nodes.len(), 1);
        assert!(matches!(
            load_path(&dir.join("missing")),
            Err(FileSourceError::Stat { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
