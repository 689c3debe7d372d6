//! Pipeline text → [`Pipeline`], or every error at once.
//!
//! The text is first read into a small located tree ([`Node`]): YAML through serde-saphyr,
//! whose `Spanned` gives each node its line, JSON through serde_json (no lines). The
//! tree is then walked against the format of [`super::doc`], collecting every error with
//! its field path. Deserializing straight into the doc types would stop at the first
//! error and lose the lines of semantic errors (duplicates, unknown needs, cycles).

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, MessageFormatter, Spanned, UserMessageFormatter};

use super::{
    Backoff, Concurrency, GateSpec, LocalCommand, Pipeline, PodTemplate, Resources, RetryOn,
    RetryPolicy, Step, StepAction,
};
use crate::limits;

mod params;
pub use params::Binding;

/// The syntax of a pipeline document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

/// One problem in a pipeline document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the offending field, such as `steps[2].retry.max`; empty for the whole
    /// document (syntax errors, size limits).
    pub field: String,
    /// 1-based line in the source, when known (YAML only).
    pub line: Option<u64>,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.field.is_empty(), self.line) {
            (true, None) => write!(f, "{}", self.message),
            (true, Some(line)) => write!(f, "line {line}: {}", self.message),
            (false, None) => write!(f, "{}: {}", self.field, self.message),
            (false, Some(line)) => write!(f, "{} (line {line}): {}", self.field, self.message),
        }
    }
}

/// A valid pipeline and the warnings its author should see.
#[derive(Clone, Debug, PartialEq)]
pub struct ParseOutcome {
    pub pipeline: Pipeline,
    pub warnings: Vec<String>,
}

/// The honest warning every pipeline using `retry:` is accepted with (docs/pipeline.md).
pub fn retry_warning() -> &'static str {
    "retry re-runs the whole step at-least-once; enable it only if the step is idempotent \
     or fenced against a cooperating sink"
}

/// Parses and validates a pipeline document on its own (parameters take their defaults,
/// or their names). Returns every error found, sorted by line then field. Never panics,
/// whatever the input.
pub fn parse(source: &str, format: Format) -> Result<ParseOutcome, Vec<FieldError>> {
    parse_with(source, format, Binding::Check)
}

/// Parses and validates a pipeline document for a run: with `Binding::Values`, the
/// values given (each checked against its declaration; errors name `params.NAME`) and
/// the defaults are substituted, and recorded in the pipeline's `params`.
pub fn parse_with(
    source: &str,
    format: Format,
    binding: Binding,
) -> Result<ParseOutcome, Vec<FieldError>> {
    let mut root = read_tree(source, format).map_err(|error| vec![error])?;
    let mut errors = Errors::default();
    let declared = params::declarations(&Field::root(&root), &mut errors);
    let values = params::bind(&declared, binding, &mut errors);
    if !matches!(binding, Binding::Off) {
        params::substitute(&mut root, &values, &mut errors);
    }
    let pipeline = check_pipeline(&root, &mut errors).map(|mut pipeline| {
        if let Binding::Values(_) = binding {
            pipeline.params = values.into_iter().collect();
        }
        pipeline
    });
    match pipeline {
        Some(pipeline) if errors.0.is_empty() => {
            let warnings = pipeline_warnings(&pipeline);
            Ok(ParseOutcome { pipeline, warnings })
        }
        // Every check that gives up records why; the guard keeps a lapse from
        // returning an empty error list.
        None if errors.0.is_empty() => Err(vec![document_error(None, "invalid pipeline")]),
        _ => Err(errors.into_sorted()),
    }
}

fn pipeline_warnings(pipeline: &Pipeline) -> Vec<String> {
    let any_retry = pipeline.steps.iter().any(|step| step.retry.is_some());
    if any_retry {
        vec![retry_warning().to_string()]
    } else {
        Vec::new()
    }
}

// --- The field names the walker accepts (kept equal to `doc` by tests) ---------------

const PIPELINE_FIELDS: &[&str] = &[
    "name",
    "budget",
    "priority",
    "parallelism",
    "concurrency",
    "kubernetes",
    "steps",
    "params",
];
const CONCURRENCY_FIELDS: &[&str] = &["group", "limit", "supersede"];
const STEP_FIELDS: &[&str] = &[
    "name",
    "executor",
    "run",
    "needs",
    "timeout",
    "env",
    "workdir",
    "retry",
    "image",
    "command",
    "args",
    "resources",
    "service_account",
    "node_selector",
    "slots",
    "locks",
    "gate",
];
/// Step fields that only a Kubernetes step may have.
const POD_FIELDS: &[&str] = &[
    "image",
    "command",
    "args",
    "resources",
    "service_account",
    "node_selector",
];
/// Pipeline-level defaults for Kubernetes steps.
const KUBERNETES_FIELDS: &[&str] = &["image", "resources", "service_account", "node_selector"];
const RESOURCES_FIELDS: &[&str] = &["requests", "limits"];
const GATE_FIELDS: &[&str] = &["auto_release", "expires", "message"];
/// The only step fields a gate step may have.
const GATE_STEP_FIELDS: &[&str] = &["name", "needs", "gate"];
const EXECUTORS: &[&str] = &["local", "kubernetes"];
const RETRY_FIELDS: &[&str] = &["on", "max", "backoff"];
const BACKOFF_FIELDS: &[&str] = &["initial", "factor", "max"];

/// `retry.on` spellings and the classes each covers.
#[rustfmt::skip]
const RETRY_CLASSES: &[(&str, RetryOn)] = &[
    ("failure", RetryOn::FAILURE),
    ("step", RetryOn { step: true, ..NO_CLASS }),
    ("timeout", RetryOn { timeout: true, ..NO_CLASS }),
    ("infra", RetryOn { infra: true, ..NO_CLASS }),
    ("lost", RetryOn { lost: true, ..NO_CLASS }),
];

/// `RetryOn::default()`, usable in constants.
const NO_CLASS: RetryOn = RetryOn {
    step: false,
    timeout: false,
    infra: false,
    lost: false,
};

const RESERVED_ENV_PREFIX: &str = "SCARAB_";
const DURATION_EXAMPLES: &str = "such as \"90s\", \"10m\" or \"1h30m\"";

// --- The located tree ----------------------------------------------------------------

/// A document node and the line it starts on (`None` for JSON, or if unknown).
#[derive(Debug)]
struct Node {
    line: Option<u64>,
    value: Value,
}

#[derive(Debug)]
enum Value {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in document order, duplicates kept so the walker can report them.
    Map(Vec<Entry>),
}

#[derive(Debug)]
struct Entry {
    key: Key,
    value: Node,
}

#[derive(Debug)]
struct Key {
    name: String,
    line: Option<u64>,
}

impl Value {
    /// How the value reads in "found …" messages.
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// serde-saphyr reports line 0 for positions it does not know (and for non-YAML input).
fn known_line(location: &Location) -> Option<u64> {
    Some(location.line()).filter(|&line| line > 0)
}

/// A node read from YAML: serde-saphyr's `Spanned` supplies its line.
struct YamlNode(Node);

/// A mapping key read from YAML, with its line (unknown fields are reported there).
struct YamlKey(Key);

/// A node read from JSON. serde_json gives no positions to a visitor, and `Spanned`
/// cannot read JSON keys, hence a path of its own.
struct JsonNode(Node);

/// A mapping key read from JSON.
struct JsonKey(Key);

/// The value under a YAML node's span.
struct YamlValue(Value);

impl From<YamlNode> for Node {
    fn from(node: YamlNode) -> Node {
        node.0
    }
}

impl From<JsonNode> for Node {
    fn from(node: JsonNode) -> Node {
        node.0
    }
}

impl From<YamlKey> for Key {
    fn from(key: YamlKey) -> Key {
        key.0
    }
}

impl From<JsonKey> for Key {
    fn from(key: JsonKey) -> Key {
        key.0
    }
}

impl<'de> Deserialize<'de> for YamlNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<YamlValue>::deserialize(deserializer)?;
        Ok(YamlNode(Node {
            line: known_line(&spanned.referenced),
            value: spanned.value.0,
        }))
    }
}

impl<'de> Deserialize<'de> for YamlValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let visitor = ValueVisitor::<YamlNode, YamlKey>(PhantomData);
        deserializer.deserialize_any(visitor).map(YamlValue)
    }
}

impl<'de> Deserialize<'de> for YamlKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<String>::deserialize(deserializer)?;
        Ok(YamlKey(Key {
            line: known_line(&spanned.referenced),
            name: spanned.value,
        }))
    }
}

impl<'de> Deserialize<'de> for JsonNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let visitor = ValueVisitor::<JsonNode, JsonKey>(PhantomData);
        let value = deserializer.deserialize_any(visitor)?;
        Ok(JsonNode(Node { line: None, value }))
    }
}

impl<'de> Deserialize<'de> for JsonKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(JsonKey(Key { name, line: None }))
    }
}

/// Builds a [`Value`] from any self-describing format; `N` and `K` read the children
/// and keys the way the format can locate them.
struct ValueVisitor<N, K>(PhantomData<(N, K)>);

impl<'de, N, K> Visitor<'de> for ValueVisitor<N, K>
where
    N: Deserialize<'de> + Into<Node>,
    K: Deserialize<'de> + Into<Key>,
{
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping, list, string, number, boolean or null")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        Ok(Value::Int(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        // Beyond i128 no limit can be met anyway; saturate rather than fail the parse.
        Ok(Value::Int(i128::try_from(v).unwrap_or(i128::MAX)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<N>()? {
            items.push(item.into());
        }
        Ok(Value::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<K>()? {
            let value = map.next_value::<N>()?.into();
            entries.push(Entry {
                key: key.into(),
                value,
            });
        }
        Ok(Value::Map(entries))
    }
}

// --- Reading the text ----------------------------------------------------------------

fn document_error(line: Option<u64>, message: impl Into<String>) -> FieldError {
    FieldError {
        field: String::new(),
        line,
        message: message.into(),
    }
}

fn read_tree(source: &str, format: Format) -> Result<Node, FieldError> {
    if source.len() > limits::PIPELINE_MAX_BYTES {
        return Err(document_error(
            None,
            format!(
                "the document is {} bytes; at most {} are accepted",
                source.len(),
                limits::PIPELINE_MAX_BYTES
            ),
        ));
    }
    if source.trim().is_empty() {
        return Err(document_error(None, "the document is empty"));
    }
    let root = match format {
        Format::Yaml => read_yaml(source)?,
        Format::Json => read_json(source)?,
    };
    if nesting_exceeds(&root, limits::PIPELINE_MAX_DEPTH) {
        return Err(document_error(
            root.line,
            format!(
                "the document is nested more than {} levels deep",
                limits::PIPELINE_MAX_DEPTH
            ),
        ));
    }
    Ok(root)
}

/// Options bounding what a hostile document can cost: nesting, node count and alias
/// expansion (billion laughs) are capped well above what a valid pipeline needs.
fn yaml_options() -> serde_saphyr::Options {
    /// A valid pipeline fits in `PIPELINE_MAX_BYTES` and a node takes at least two bytes.
    const MAX_NODES: usize = limits::PIPELINE_MAX_BYTES / 2;
    let mut options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: limits::PIPELINE_MAX_DEPTH,
            max_nodes: MAX_NODES,
            max_events: 2 * MAX_NODES,
            max_documents: 1,
            max_total_scalar_bytes: limits::PIPELINE_MAX_BYTES,
        },
        // Duplicates reach the walker, which reports them with their field path.
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
        // YAML 1.2 booleans only: `on`, `yes`, `off` stay strings (`retry: {on: step}`).
        strict_booleans: true,
        reject_unsupported_tags: true,
        with_snippet: false,
    };
    options.alias_limits.max_total_replayed_events = MAX_NODES;
    options
}

fn read_yaml(source: &str) -> Result<Node, FieldError> {
    serde_saphyr::from_str_with_options::<YamlNode>(source, yaml_options())
        .map(Node::from)
        .map_err(|error| {
            let line = error.location().as_ref().and_then(known_line);
            // The formatter gives the bare message; the line travels in `FieldError::line`.
            let message = UserMessageFormatter.format_message(&error);
            let message: String = message.chars().filter(|c| !c.is_control()).collect();
            document_error(line, format!("invalid YAML: {message}"))
        })
}

fn read_json(source: &str) -> Result<Node, FieldError> {
    serde_json::from_str::<JsonNode>(source)
        .map(Node::from)
        .map_err(|error| {
            let line = u64::try_from(error.line()).ok().filter(|&line| line > 0);
            // serde_json appends the position to its message; the line has a field of its own.
            let text = error.to_string();
            let position = format!(" at line {} column {}", error.line(), error.column());
            let message = text.strip_suffix(&position).unwrap_or(&text);
            document_error(line, format!("invalid JSON: {message}"))
        })
}

/// Whether collections nest deeper than `limit`. The parsers bound the depth already
/// (serde-saphyr by budget, serde_json at 128), so this recursion is bounded too.
fn nesting_exceeds(node: &Node, limit: usize) -> bool {
    match (&node.value, limit.checked_sub(1)) {
        (Value::Seq(_) | Value::Map(_), None) => true,
        (Value::Seq(items), Some(below)) => items.iter().any(|item| nesting_exceeds(item, below)),
        (Value::Map(entries), Some(below)) => entries
            .iter()
            .any(|entry| nesting_exceeds(&entry.value, below)),
        _ => false,
    }
}

// --- Walking the tree ------------------------------------------------------------------

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn at(&mut self, field: &Field, message: impl Into<String>) {
        self.push(field.path.clone(), field.node.line, message);
    }

    fn push(&mut self, field: String, line: Option<u64>, message: impl Into<String>) {
        self.0.push(FieldError {
            field,
            line,
            message: message.into(),
        });
    }

    /// `None` (no line) sorts first: those are whole-document errors.
    fn into_sorted(mut self) -> Vec<FieldError> {
        self.0.sort_by(|a, b| {
            a.line
                .cmp(&b.line)
                .then_with(|| natural_cmp(&a.field, &b.field))
                .then_with(|| a.message.cmp(&b.message))
        });
        self.0
    }
}

/// Orders digit runs by value so `steps[2]` comes before `steps[10]`.
fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        let (Some(ca), Some(cb)) = (a.chars().next(), b.chars().next()) else {
            return a.len().cmp(&b.len());
        };
        if ca.is_ascii_digit() && cb.is_ascii_digit() {
            let (na, rest_a) = split_digits(a);
            let (nb, rest_b) = split_digits(b);
            let by_value = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
            if by_value != Ordering::Equal {
                return by_value;
            }
            (a, b) = (rest_a, rest_b);
        } else if ca != cb {
            return ca.cmp(&cb);
        } else {
            (a, b) = (&a[ca.len_utf8()..], &b[cb.len_utf8()..]);
        }
    }
}

/// Splits a leading run of ASCII digits (leading zeros dropped) from the rest.
fn split_digits(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, rest) = s.split_at(end);
    (digits.trim_start_matches('0'), rest)
}

/// A node and its field path (`steps[1].retry`; empty for the document).
struct Field<'a> {
    node: &'a Node,
    path: String,
}

impl<'a> Field<'a> {
    fn root(node: &'a Node) -> Self {
        Field {
            node,
            path: String::new(),
        }
    }

    fn key(&self, key: &str, node: &'a Node) -> Field<'a> {
        let path = if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        };
        Field { node, path }
    }

    fn index(&self, index: usize, node: &'a Node) -> Field<'a> {
        Field {
            node,
            path: format!("{}[{index}]", self.path),
        }
    }

    /// The string value, if it is one (no error otherwise).
    fn text(&self) -> Option<&'a str> {
        match &self.node.value {
            Value::Str(text) => Some(text),
            _ => None,
        }
    }

    fn found(&self) -> &'static str {
        self.node.value.kind()
    }
}

/// The entries of a mapping node, after duplicate keys were reported.
fn as_map<'a>(field: &Field<'a>, errors: &mut Errors) -> Option<&'a [Entry]> {
    let Value::Map(entries) = &field.node.value else {
        errors.at(
            field,
            format!("must be a mapping (found {})", field.found()),
        );
        return None;
    };
    let mut seen = HashSet::new();
    for entry in entries {
        if !seen.insert(entry.key.name.as_str()) {
            let path = field.key(&entry.key.name, &entry.value).path;
            errors.push(path, entry.key.line, "duplicate key");
        }
    }
    Some(entries)
}

/// A mapping with a fixed set of fields.
struct Fields<'a, 'f> {
    parent: &'f Field<'a>,
    entries: &'a [Entry],
}

impl<'a> Fields<'a, '_> {
    fn get(&self, key: &str) -> Option<Field<'a>> {
        let entry = self.entries.iter().find(|entry| entry.key.name == key)?;
        Some(self.parent.key(key, &entry.value))
    }

    /// The field, or an error at its would-be path and the mapping's line.
    fn required(&self, key: &str, errors: &mut Errors) -> Option<Field<'a>> {
        let field = self.get(key);
        if field.is_none() {
            let path = self.parent.key(key, self.parent.node).path;
            errors.push(path, self.parent.node.line, "required field missing");
        }
        field
    }
}

fn as_fields<'a, 'f>(
    field: &'f Field<'a>,
    known: &[&str],
    errors: &mut Errors,
) -> Option<Fields<'a, 'f>> {
    let entries = as_map(field, errors)?;
    for entry in entries
        .iter()
        .filter(|e| !known.contains(&e.key.name.as_str()))
    {
        let path = field.key(&entry.key.name, &entry.value).path;
        errors.push(
            path,
            entry.key.line,
            unknown_field_message(&entry.key.name, known),
        );
    }
    Some(Fields {
        parent: field,
        entries,
    })
}

fn unknown_field_message(key: &str, known: &[&str]) -> String {
    let hint = did_you_mean(key, known.iter().copied())
        .map(|name| format!(" (did you mean \"{name}\"?)"))
        .unwrap_or_default();
    format!("unknown field{hint}; known fields: {}", known.join(", "))
}

/// The closest candidate within two edits, if any: typos, not different words.
fn did_you_mean<'c>(word: &str, candidates: impl Iterator<Item = &'c str>) -> Option<&'c str> {
    /// Longer than any valid name: the quadratic distance is not worth it beyond.
    const MAX_CHARS: usize = 64;
    let length = word.chars().count();
    if length > MAX_CHARS {
        return None;
    }
    candidates
        // Lengths differing by more than two already mean more than two edits.
        .filter(|candidate| candidate.chars().count().abs_diff(length) <= 2)
        .map(|candidate| (edit_distance(word, candidate), candidate))
        .filter(|&(distance, candidate)| distance <= 2 && distance < candidate.chars().count())
        // Ties go to the alphabetically first name, so the hint is deterministic.
        .min()
        .map(|(_, candidate)| candidate)
}

/// Optimal string alignment distance: Levenshtein plus adjacent transpositions.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

fn as_str<'a>(field: &Field<'a>, errors: &mut Errors) -> Option<&'a str> {
    let text = field.text();
    if text.is_none() {
        errors.at(field, format!("must be a string (found {})", field.found()));
    }
    text
}

/// The items of a list node; `what` names the expected contents for the message.
fn as_seq<'a>(field: &Field<'a>, what: &str, errors: &mut Errors) -> Option<Vec<Field<'a>>> {
    let Value::Seq(items) = &field.node.value else {
        errors.at(
            field,
            format!("must be a list of {what} (found {})", field.found()),
        );
        return None;
    };
    let items = items.iter().enumerate();
    Some(items.map(|(i, node)| field.index(i, node)).collect())
}

/// `Some(None)` when the field is absent, `None` when it is present but invalid.
fn optional<'a, T>(
    field: Option<Field<'a>>,
    check: impl FnOnce(&Field<'a>) -> Option<T>,
) -> Option<Option<T>> {
    match field {
        None => Some(None),
        Some(field) => check(&field).map(Some),
    }
}

// --- The pipeline ----------------------------------------------------------------------

fn check_pipeline(root: &Node, errors: &mut Errors) -> Option<Pipeline> {
    let root = Field::root(root);
    if let Value::Null = root.node.value {
        errors.push(String::new(), None, "the document is empty");
        return None;
    }
    if !matches!(root.node.value, Value::Map(_)) {
        let message = format!(
            "the document must be a mapping with \"name\" and \"steps\" (found {})",
            root.found()
        );
        errors.push(String::new(), root.node.line, message);
        return None;
    }
    let fields = as_fields(&root, PIPELINE_FIELDS, errors)?;
    let name = fields
        .required("name", errors)
        .and_then(|field| check_pipeline_name(&field, errors));
    let budget = optional(fields.get("budget"), |field| {
        check_duration(field, limits::BUDGET_MIN, limits::BUDGET_MAX, errors)
    });
    // Defaults that do not validate are reported; steps then check against none.
    let priority = optional(fields.get("priority"), |field| {
        let value = check_integer(
            field,
            limits::PRIORITY_MIN.into(),
            limits::PRIORITY_MAX.into(),
            errors,
        )?;
        i32::try_from(value).ok()
    });
    let parallelism = optional(fields.get("parallelism"), |field| {
        let value = check_integer(field, 1, limits::STEPS_MAX as i128, errors)?;
        u32::try_from(value).ok()
    });
    let concurrency = optional(fields.get("concurrency"), |field| {
        check_concurrency(field, errors)
    });
    let defaults = optional(fields.get("kubernetes"), |field| {
        check_pod_defaults(field, errors)
    })
    .flatten()
    .unwrap_or_default();
    let steps = fields
        .required("steps", errors)
        .and_then(|field| check_steps(&field, &defaults, errors));
    Some(Pipeline {
        name: name?,
        budget: budget?,
        priority: priority?.unwrap_or(0),
        parallelism: parallelism?,
        concurrency: concurrency?,
        params: Vec::new(),
        steps: steps?,
    })
}

/// `concurrency: {group, limit, supersede}`: runs sharing a group share its run slots.
fn check_concurrency(field: &Field, errors: &mut Errors) -> Option<Concurrency> {
    let fields = as_fields(field, CONCURRENCY_FIELDS, errors)?;
    let group = fields.required("group", errors).and_then(|field| {
        let name = as_str(&field, errors)?;
        match limits::check_admission_name(name, limits::GROUP_NAME_MAX_BYTES) {
            Ok(()) => Some(name.to_owned()),
            Err(problem) => {
                errors.at(&field, problem);
                None
            }
        }
    });
    let limit = optional(fields.get("limit"), |field| {
        let value = check_integer(field, 1, limits::GROUP_LIMIT_MAX.into(), errors)?;
        u32::try_from(value).ok()
    });
    let supersede = optional(fields.get("supersede"), |field| check_bool(field, errors));
    Some(Concurrency {
        group: group?,
        limit: limit?.unwrap_or(1),
        supersede: supersede?.unwrap_or(false),
    })
}

fn check_bool(field: &Field, errors: &mut Errors) -> Option<bool> {
    if let Value::Bool(value) = field.node.value {
        return Some(value);
    }
    errors.at(
        field,
        format!("must be true or false (found {})", field.found()),
    );
    None
}

/// `slots: N` of a local step: how many of `engine.max_parallel_local` it takes.
fn check_slots(fields: &Fields, pod: bool, errors: &mut Errors) -> Option<u32> {
    let Some(field) = fields.get("slots") else {
        return Some(1);
    };
    if pod {
        errors.at(
            &field,
            "only for local steps: a Pod takes one slot of kubernetes.max_pods",
        );
        return None;
    }
    let value = check_integer(&field, 1, limits::SLOTS_MAX.into(), errors)?;
    u32::try_from(value).ok()
}

/// `locks: [NAME, ...]`: named locks of the configuration, taken all at once.
fn check_locks(field: &Field, errors: &mut Errors) -> Option<Vec<String>> {
    let items = as_seq(field, "lock names", errors)?;
    if items.len() > limits::LOCKS_PER_STEP_MAX {
        errors.at(
            field,
            format!(
                "must name at most {} locks (found {})",
                limits::LOCKS_PER_STEP_MAX,
                items.len()
            ),
        );
        return None;
    }
    let mut names: Vec<String> = Vec::new();
    let mut valid = true;
    for item in &items {
        let Some(name) = as_str(item, errors) else {
            valid = false;
            continue;
        };
        if let Err(problem) = limits::check_admission_name(name, limits::LOCK_NAME_MAX_BYTES) {
            errors.at(item, problem);
            valid = false;
        } else if names.iter().any(|n| n == name) {
            errors.at(item, format!("lock {name:?} is named twice"));
            valid = false;
        } else {
            names.push(name.to_owned());
        }
    }
    valid.then_some(names)
}

fn check_pipeline_name(field: &Field, errors: &mut Errors) -> Option<String> {
    let name = as_str(field, errors)?;
    let chars = name.chars().count();
    let problem = if chars == 0 {
        "must not be empty".to_owned()
    } else if chars > limits::PIPELINE_NAME_MAX_CHARS {
        format!(
            "must be at most {} characters (found {chars})",
            limits::PIPELINE_NAME_MAX_CHARS
        )
    } else if let Err(problem) = crate::text::check(name, false) {
        problem
    } else {
        return Some(name.to_owned());
    };
    errors.at(field, problem);
    None
}

// --- Steps -----------------------------------------------------------------------------

/// What the per-step check learned, kept even when the step is invalid so that the
/// cross-step checks (names, needs, cycles) still run and report.
struct StepCheck<'a> {
    /// The step with `needs` still empty; `None` if any of its own fields is invalid.
    step: Option<Step>,
    /// The `name` field and its text if it is a string, valid or not: needs may refer
    /// to it.
    name: Option<(Field<'a>, &'a str)>,
    needs: Option<Field<'a>>,
    need_names: Vec<(Field<'a>, &'a str)>,
    /// Whether the step has a `gate` field, valid or not: a gate has no outputs.
    gate: bool,
}

fn check_steps(field: &Field, defaults: &PodDefaults, errors: &mut Errors) -> Option<Vec<Step>> {
    let items = as_seq(field, "steps", errors)?;
    let count_ok = check_step_count(field, items.len(), errors);
    let checks: Vec<StepCheck> = items
        .iter()
        .map(|item| check_step(item, defaults, errors))
        .collect();
    // The cross-step checks are quadratic (suggestions, cycles): they run only on a
    // step count within limits. Beyond it, that one error is what matters.
    let needs = if count_ok {
        check_unique_names(&checks, errors);
        let needs = resolve_needs(&checks, errors);
        check_cycles(&checks, &needs, errors);
        check_output_references(field, &checks, &needs, errors);
        needs
    } else {
        vec![Vec::new(); checks.len()]
    };
    let steps = checks.into_iter().zip(needs).map(|(check, needs)| {
        let step = check.step?;
        Some(Step { needs, ..step })
    });
    steps.collect()
}

/// `${steps.NAME.outputs.KEY}` in an env value must name a step this one needs (directly
/// or through others): only then is its output there when this step starts.
fn check_output_references(
    field: &Field,
    checks: &[StepCheck],
    needs: &[Vec<usize>],
    errors: &mut Errors,
) {
    for (index, check) in checks.iter().enumerate() {
        let Some(step) = &check.step else { continue };
        let env = match &step.action {
            StepAction::Local(command) => &command.env,
            StepAction::Kubernetes(pod) => &pod.env,
            StepAction::Gate(_) => continue,
        };
        let ancestors = reachable(needs, index);
        for (key, value) in env {
            for reference in output_references(value) {
                let path = format!("{}[{index}].env.{key}", field.path);
                let target = checks
                    .iter()
                    .position(|c| c.name.as_ref().is_some_and(|(_, n)| *n == reference.0));
                let problem = match target {
                    None => format!("references unknown step {:?}", reference.0),
                    Some(target) if checks[target].gate => {
                        format!("step {:?} is a gate and has no outputs", reference.0)
                    }
                    Some(target) if !ancestors[target] => {
                        format!(
                            "references step {:?}, which this step does not need",
                            reference.0
                        )
                    }
                    Some(_) if reference.1.is_empty() => "names no output".to_owned(),
                    Some(_) => continue,
                };
                errors.push(path, None, problem);
            }
        }
    }
}

/// The (step, output) pairs of `${steps.STEP.outputs.OUTPUT}` references in a value.
fn output_references(value: &str) -> Vec<(&str, &str)> {
    let mut found = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find("${steps.") {
        let after = &rest[start + "${steps.".len()..];
        let Some(end) = after.find('}') else { break };
        if let Some((step, output)) = after[..end].split_once(".outputs.") {
            found.push((step, output));
        }
        rest = &after[end..];
    }
    found
}

fn check_step_count(field: &Field, count: usize, errors: &mut Errors) -> bool {
    if count == 0 {
        errors.at(field, "must have at least one step");
    } else if count > limits::STEPS_MAX {
        let message = format!(
            "must have at most {} steps (found {count})",
            limits::STEPS_MAX
        );
        errors.at(field, message);
    } else {
        return true;
    }
    false
}

fn check_step<'a>(field: &Field<'a>, defaults: &PodDefaults, errors: &mut Errors) -> StepCheck<'a> {
    let Some(fields) = as_fields(field, STEP_FIELDS, errors) else {
        return StepCheck {
            step: None,
            name: None,
            needs: None,
            need_names: Vec::new(),
            gate: false,
        };
    };
    let name = fields.required("name", errors);
    let valid_name = name.as_ref().and_then(|name| check_step_name(name, errors));
    let needs = fields.get("needs");
    let need_names = needs
        .as_ref()
        .map(|needs| check_need_names(needs, errors))
        .unwrap_or_default();
    let step = check_step_body(&fields, valid_name, defaults, errors);
    StepCheck {
        step,
        name: name.and_then(|field| field.text().map(|text| (field, text))),
        needs,
        need_names,
        gate: fields.get("gate").is_some(),
    }
}

/// Everything of a step but its needs.
fn check_step_body(
    fields: &Fields,
    name: Option<String>,
    defaults: &PodDefaults,
    errors: &mut Errors,
) -> Option<Step> {
    if let Some(gate) = fields.get("gate") {
        let gate = check_gate_step(fields, &gate, errors);
        return Some(Step {
            name: name?,
            needs: Vec::new(),
            timeout: None,
            retry: None,
            slots: 0,
            locks: Vec::new(),
            action: StepAction::Gate(gate?),
        });
    }
    let executor = optional(fields.get("executor"), |field| {
        check_executor(field, errors)
    });
    let action = match executor {
        // An invalid executor: its error stands; the rest is still checked as local.
        None | Some(None) | Some(Some(Executor::Local)) => check_local(fields, errors),
        Some(Some(Executor::Kubernetes)) => check_pod(fields, defaults, errors),
    };
    let timeout = optional(fields.get("timeout"), |field| {
        check_duration(
            field,
            limits::STEP_TIMEOUT_MIN,
            limits::STEP_TIMEOUT_MAX,
            errors,
        )
    });
    let retry = optional(fields.get("retry"), |field| check_retry(field, errors));
    let pod = matches!(executor, Some(Some(Executor::Kubernetes)));
    let slots = check_slots(fields, pod, errors);
    let locks = optional(fields.get("locks"), |field| check_locks(field, errors));
    Some(Step {
        name: name?,
        needs: Vec::new(),
        timeout: timeout?,
        retry: retry?,
        slots: slots?,
        locks: locks?.unwrap_or_default(),
        action: action?,
    })
}

enum Executor {
    Local,
    Kubernetes,
}

fn check_executor(field: &Field, errors: &mut Errors) -> Option<Executor> {
    match as_str(field, errors)? {
        "local" => Some(Executor::Local),
        "kubernetes" => Some(Executor::Kubernetes),
        other => {
            let known = EXECUTORS.join(", ");
            errors.at(field, format!("unknown executor {other:?}; one of {known}"));
            None
        }
    }
}

/// A local step: `run` is its argv; the Pod fields are not for it.
fn check_local(fields: &Fields, errors: &mut Errors) -> Option<StepAction> {
    for key in POD_FIELDS {
        if let Some(field) = fields.get(key) {
            errors.at(&field, "only for steps with executor: kubernetes");
        }
    }
    let argv = fields
        .required("run", errors)
        .and_then(|field| check_argv(&field, errors));
    let env = optional(fields.get("env"), |field| check_env(field, errors));
    let workdir = optional(fields.get("workdir"), |field| check_workdir(field, errors));
    let env = env?.unwrap_or_default();
    Some(StepAction::Local(LocalCommand {
        argv: argv?,
        env: env.plain,
        secrets: env.secrets,
        workdir: workdir?,
    }))
}

/// A gate step: `name`, `needs` and `gate`, nothing that would run.
fn check_gate_step(fields: &Fields, gate: &Field, errors: &mut Errors) -> Option<GateSpec> {
    let runnable = STEP_FIELDS
        .iter()
        .filter(|key| !GATE_STEP_FIELDS.contains(key));
    for key in runnable {
        if let Some(field) = fields.get(key) {
            let message = format!("a gate step {} (remove {key} or gate)", gate_lacks(key));
            errors.at(&field, message);
        }
    }
    check_gate(gate, errors)
}

/// Why a runnable step's field has no meaning on a gate.
fn gate_lacks(key: &str) -> &'static str {
    match key {
        "run" | "command" | "args" => "has no command",
        "executor" => "has no executor",
        "timeout" => "has no timeout; bound its wait with gate.expires",
        "retry" => "is never retried",
        "slots" | "locks" => "takes no slot or lock (the run's concurrency group applies)",
        _ => "runs nothing",
    }
}

fn check_gate(field: &Field, errors: &mut Errors) -> Option<GateSpec> {
    let fields = as_fields(field, GATE_FIELDS, errors)?;
    let auto_release = optional(fields.get("auto_release"), |field| {
        check_gate_wait(field, errors)
    });
    let expires = optional(fields.get("expires"), |field| {
        check_gate_wait(field, errors)
    });
    let message = optional(fields.get("message"), |field| {
        check_gate_message(field, errors)
    });
    let gate = GateSpec {
        auto_release: auto_release?,
        expires: expires?,
        message: message?,
    };
    check_gate_order(&fields, &gate, errors).then_some(gate)
}

fn check_gate_wait(field: &Field, errors: &mut Errors) -> Option<Duration> {
    check_duration(field, limits::GATE_WAIT_MIN, limits::GATE_WAIT_MAX, errors)
}

/// `auto_release` must come before `expires`, or the gate would expire first and the
/// release could never happen.
fn check_gate_order(fields: &Fields, gate: &GateSpec, errors: &mut Errors) -> bool {
    let (Some(auto_release), Some(expires)) = (gate.auto_release, gate.expires) else {
        return true;
    };
    if auto_release < expires {
        return true;
    }
    if let Some(field) = fields.get("auto_release") {
        let expires = human_duration(expires);
        errors.at(&field, format!("must be shorter than expires ({expires})"));
    }
    false
}

fn check_gate_message(field: &Field, errors: &mut Errors) -> Option<String> {
    let message = as_str(field, errors)?;
    let problem = if message.len() > limits::GATE_MESSAGE_MAX_BYTES {
        let limit = limits::GATE_MESSAGE_MAX_BYTES;
        format!("must be at most {limit} bytes (found {})", message.len())
    } else if let Err(problem) = crate::text::check(message, true) {
        problem
    } else {
        return Some(message.to_owned());
    };
    errors.at(field, problem);
    None
}

/// Pipeline-level `kubernetes:` defaults; each field a step may override.
#[derive(Default)]
struct PodDefaults {
    image: Option<String>,
    resources: Option<Resources>,
    service_account: Option<String>,
    node_selector: Option<Vec<(String, String)>>,
}

fn check_pod_defaults(field: &Field, errors: &mut Errors) -> Option<PodDefaults> {
    let fields = as_fields(field, KUBERNETES_FIELDS, errors)?;
    let image = optional(fields.get("image"), |f| check_image(f, errors));
    let resources = optional(fields.get("resources"), |f| check_resources(f, errors));
    let service_account = optional(fields.get("service_account"), |f| {
        check_dns_subdomain(f, errors)
    });
    let node_selector = optional(fields.get("node_selector"), |f| check_label_map(f, errors));
    Some(PodDefaults {
        image: image?,
        resources: resources?,
        service_account: service_account?,
        node_selector: node_selector?,
    })
}

/// A Kubernetes step: one container from `image`, `command` and `args` (never `run`).
fn check_pod(fields: &Fields, defaults: &PodDefaults, errors: &mut Errors) -> Option<StepAction> {
    if let Some(field) = fields.get("run") {
        errors.at(
            &field,
            "a kubernetes step uses `command` and `args`, not `run`",
        );
    }
    let image = match fields.get("image") {
        Some(field) => check_image(&field, errors),
        None if defaults.image.is_some() => defaults.image.clone(),
        None => fields.required("image", errors).and(None),
    };
    let command = optional(fields.get("command"), |f| check_argv(f, errors));
    let args = optional(fields.get("args"), |f| check_args(f, errors));
    let env = optional(fields.get("env"), |f| check_env(f, errors));
    let workdir = optional(fields.get("workdir"), |f| check_workdir(f, errors));
    let resources = optional(fields.get("resources"), |f| check_resources(f, errors));
    let service_account = optional(fields.get("service_account"), |f| {
        check_dns_subdomain(f, errors)
    });
    let node_selector = optional(fields.get("node_selector"), |f| check_label_map(f, errors));
    let env = env?.unwrap_or_default();
    Some(StepAction::Kubernetes(Box::new(PodTemplate {
        image: image?,
        command: command?.unwrap_or_default(),
        args: args?.unwrap_or_default(),
        env: env.plain,
        secrets: env.secrets,
        workdir: workdir?,
        resources: resources?
            .or_else(|| defaults.resources.clone())
            .unwrap_or_default(),
        service_account: service_account?.or_else(|| defaults.service_account.clone()),
        node_selector: node_selector?
            .or_else(|| defaults.node_selector.clone())
            .unwrap_or_default(),
    })))
}

fn check_image(field: &Field, errors: &mut Errors) -> Option<String> {
    let image = as_str(field, errors)?;
    let problem = if image.is_empty() {
        "must not be empty".to_owned()
    } else if image.len() > limits::IMAGE_MAX_BYTES {
        format!(
            "must be at most {} bytes (found {})",
            limits::IMAGE_MAX_BYTES,
            image.len()
        )
    } else if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "must not contain whitespace or control characters".to_owned()
    } else {
        return Some(image.to_owned());
    };
    errors.at(field, problem);
    None
}

/// Container arguments: like `run`, but may be empty.
fn check_args(field: &Field, errors: &mut Errors) -> Option<Vec<String>> {
    let items = as_seq(field, "strings", errors)?;
    let mut valid = items.len() <= limits::ARGV_MAX_ITEMS;
    if !valid {
        let found = items.len();
        errors.at(
            field,
            format!(
                "must have at most {} items (found {found})",
                limits::ARGV_MAX_ITEMS
            ),
        );
    }
    let mut args = Vec::with_capacity(items.len());
    for item in &items {
        match check_argv_item(item, errors) {
            Some(arg) => args.push(arg),
            None => valid = false,
        }
    }
    valid.then_some(args)
}

fn check_resources(field: &Field, errors: &mut Errors) -> Option<Resources> {
    let fields = as_fields(field, RESOURCES_FIELDS, errors)?;
    let requests = optional(fields.get("requests"), |f| check_quantities(f, errors));
    let limits = optional(fields.get("limits"), |f| check_quantities(f, errors));
    Some(Resources {
        requests: requests?.unwrap_or_default(),
        limits: limits?.unwrap_or_default(),
    })
}

/// `{cpu: 500m, memory: 1Gi}`: resource names and quantities as Kubernetes spells them;
/// the API server has the final word on a quantity's syntax.
fn check_quantities(field: &Field, errors: &mut Errors) -> Option<Vec<(String, String)>> {
    let quantity = |q: &str| {
        !q.is_empty()
            && q.len() <= 64
            && q.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-'))
    };
    check_pairs(
        field,
        (is_qualified_name, "not a valid resource name"),
        (
            quantity,
            "must be a quantity such as \"500m\", \"2\" or \"1Gi\"",
        ),
        errors,
    )
}

/// `node_selector`: label keys (`[prefix/]name`) and values as Kubernetes allows them.
fn check_label_map(field: &Field, errors: &mut Errors) -> Option<Vec<(String, String)>> {
    check_pairs(
        field,
        (
            is_label_key,
            "not a valid label key ([prefix/]name, name at most 63 characters)",
        ),
        (
            is_label_value,
            "not a valid label value (at most 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends)",
        ),
        errors,
    )
}

type PairCheck<'c> = (fn(&str) -> bool, &'c str);

/// A bounded string-to-string mapping whose keys and values each pass a check; every bad
/// key and value is reported.
fn check_pairs(
    field: &Field,
    (key_ok, key_problem): PairCheck,
    (value_ok, value_problem): (impl Fn(&str) -> bool, &str),
    errors: &mut Errors,
) -> Option<Vec<(String, String)>> {
    let entries = as_map(field, errors)?;
    let mut valid = entries.len() <= limits::POD_MAP_MAX_ENTRIES;
    if !valid {
        errors.at(
            field,
            format!("must have at most {} entries", limits::POD_MAP_MAX_ENTRIES),
        );
    }
    let mut pairs = Vec::new();
    for entry in entries {
        let value = field.key(&entry.key.name, &entry.value);
        let key_valid = key_ok(&entry.key.name);
        if !key_valid {
            errors.push(value.path.clone(), entry.key.line, key_problem);
        }
        let text = as_str(&value, errors).filter(|v| {
            let ok = value_ok(v);
            if !ok {
                errors.at(&value, value_problem);
            }
            ok
        });
        match (key_valid, text) {
            (true, Some(v)) => pairs.push((entry.key.name.clone(), v.to_owned())),
            _ => valid = false,
        }
    }
    valid.then_some(pairs)
}

fn check_dns_subdomain(field: &Field, errors: &mut Errors) -> Option<String> {
    let name = as_str(field, errors)?;
    if is_dns_subdomain(name) {
        return Some(name.to_owned());
    }
    errors.at(field, "must be a DNS-1123 subdomain: at most 253 characters of [a-z0-9.-], alphanumeric at both ends");
    None
}

fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && !name.is_empty()
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

fn is_label_value(value: &str) -> bool {
    value.is_empty() || (value.len() <= 63 && is_qualified_name(value))
}

/// `[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?`, at most 63 characters.
fn is_qualified_name(name: &str) -> bool {
    let (prefix, name) = match name.rsplit_once('/') {
        Some((prefix, name)) if is_dns_subdomain(prefix) => (Some(prefix), name),
        Some(_) => return false,
        None => (None, name),
    };
    let _ = prefix;
    let edges = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    name.len() <= 63
        && edges(name.chars().next())
        && edges(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn is_label_key(key: &str) -> bool {
    is_qualified_name(key)
}

fn check_step_name(field: &Field, errors: &mut Errors) -> Option<String> {
    let name = as_str(field, errors)?;
    let chars = name.chars().count();
    let problem = if chars == 0 {
        "must not be empty".to_owned()
    } else if chars > limits::STEP_NAME_MAX_CHARS {
        format!(
            "must be at most {} characters (found {chars})",
            limits::STEP_NAME_MAX_CHARS
        )
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        "may contain only letters, digits, '_' and '-'".to_owned()
    } else {
        return Some(name.to_owned());
    };
    errors.at(field, problem);
    None
}

fn check_unique_names(checks: &[StepCheck], errors: &mut Errors) {
    let mut first_use: HashMap<&str, usize> = HashMap::new();
    for (index, (field, name)) in step_names(checks) {
        match first_use.get(name) {
            Some(first) => {
                let message =
                    format!("duplicate step name \"{name}\" (first used by steps[{first}])");
                errors.at(field, message);
            }
            None => {
                first_use.insert(name, index);
            }
        }
    }
}

/// The index, name field and name of every step whose `name` is a string.
fn step_names<'c, 'a>(
    checks: &'c [StepCheck<'a>],
) -> impl Iterator<Item = (usize, &'c (Field<'a>, &'a str))> {
    let names = checks.iter().map(|check| check.name.as_ref());
    names
        .enumerate()
        .filter_map(|(index, name)| Some((index, name?)))
}

// --- Needs and the graph ---------------------------------------------------------------

/// The string entries of `needs`, type errors reported.
fn check_need_names<'a>(field: &Field<'a>, errors: &mut Errors) -> Vec<(Field<'a>, &'a str)> {
    let Some(items) = as_seq(field, "step names", errors) else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| as_str(&item, errors).map(|name| (item, name)))
        .collect()
}

/// Each step's needs as indices; unknown names, self-references and repeats reported.
fn resolve_needs(checks: &[StepCheck], errors: &mut Errors) -> Vec<Vec<usize>> {
    let mut index_of: HashMap<&str, usize> = HashMap::new();
    for (index, (_, name)) in step_names(checks) {
        index_of.entry(name).or_insert(index);
    }
    let resolve_one = |own: usize, field: &Field, name: &str, errors: &mut Errors| {
        let Some(&target) = index_of.get(name) else {
            let hint = did_you_mean(name, index_of.keys().copied())
                .map(|known| format!(" (did you mean \"{known}\"?)"))
                .unwrap_or_default();
            errors.at(field, format!("unknown step \"{name}\"{hint}"));
            return None;
        };
        if target == own {
            errors.at(field, "a step cannot need itself");
            return None;
        }
        Some(target)
    };
    let mut resolved = Vec::with_capacity(checks.len());
    for (own, check) in checks.iter().enumerate() {
        let mut needs = Vec::new();
        for (field, name) in &check.need_names {
            match resolve_one(own, field, name, errors) {
                Some(target) if needs.contains(&target) => {
                    errors.at(field, format!("\"{name}\" is listed twice"));
                }
                Some(target) => needs.push(target),
                None => {}
            }
        }
        resolved.push(needs);
    }
    resolved
}

/// Reports each strongly connected set of steps once, naming one concrete cycle in it.
fn check_cycles(checks: &[StepCheck], needs: &[Vec<usize>], errors: &mut Errors) {
    let reach: Vec<Vec<bool>> = (0..needs.len()).map(|i| reachable(needs, i)).collect();
    let mut reported = vec![false; needs.len()];
    for start in 0..needs.len() {
        if reported[start] || !reach[start][start] {
            continue;
        }
        for other in 0..needs.len() {
            reported[other] |= reach[start][other] && reach[other][start];
        }
        let names: Vec<&str> = shortest_cycle(needs, start)
            .into_iter()
            .map(|index| step_name(checks, index))
            .collect();
        let (path, line) = match &checks[start].needs {
            Some(field) => (field.path.clone(), field.node.line),
            None => (format!("steps[{start}].needs"), None),
        };
        let message = format!(
            "dependency cycle: {} (each needs the next)",
            names.join(" → ")
        );
        errors.push(path, line, message);
    }
}

fn step_name<'a>(checks: &[StepCheck<'a>], index: usize) -> &'a str {
    checks[index].name.as_ref().map_or("?", |(_, name)| name)
}

/// Which steps `start` reaches through one or more needs (itself only via a cycle).
fn reachable(needs: &[Vec<usize>], start: usize) -> Vec<bool> {
    let mut seen = vec![false; needs.len()];
    let mut queue: VecDeque<usize> = needs[start].iter().copied().collect();
    while let Some(node) = queue.pop_front() {
        if !std::mem::replace(&mut seen[node], true) {
            queue.extend(needs[node].iter().copied());
        }
    }
    seen
}

/// The steps of a shortest cycle through `start`, starting and ending with it.
/// `start` must lie on a cycle.
fn shortest_cycle(needs: &[Vec<usize>], start: usize) -> Vec<usize> {
    let mut parent: Vec<Option<usize>> = vec![None; needs.len()];
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &next in &needs[node] {
            if next == start {
                return cycle_path(&parent, start, node);
            }
            if parent[next].is_none() {
                parent[next] = Some(node);
                queue.push_back(next);
            }
        }
    }
    vec![start]
}

/// Follows BFS parents back from `last` (whose need is `start`) to `start`.
fn cycle_path(parent: &[Option<usize>], start: usize, last: usize) -> Vec<usize> {
    let mut backwards = vec![start];
    let mut node = Some(last);
    while let Some(current) = node.filter(|&current| current != start) {
        backwards.push(current);
        node = parent[current];
    }
    backwards.push(start);
    backwards.reverse();
    backwards
}

// --- Commands --------------------------------------------------------------------------

fn check_argv(field: &Field, errors: &mut Errors) -> Option<Vec<String>> {
    let items = as_seq(field, "strings (program and arguments)", errors)?;
    let mut valid = check_argv_shape(field, items.len(), errors);
    let mut argv = Vec::with_capacity(items.len());
    for item in &items {
        match check_argv_item(item, errors) {
            Some(arg) => argv.push(arg),
            None => valid = false,
        }
    }
    if argv.first().is_some_and(String::is_empty) {
        errors.at(&items[0], "the program must not be empty");
        valid = false;
    }
    let total: usize = argv.iter().map(String::len).sum();
    if total > limits::ARGV_TOTAL_MAX_BYTES {
        let limit = limits::ARGV_TOTAL_MAX_BYTES;
        errors.at(
            field,
            format!("must total at most {limit} bytes (found {total})"),
        );
        valid = false;
    }
    valid.then_some(argv)
}

fn check_argv_shape(field: &Field, count: usize, errors: &mut Errors) -> bool {
    if count == 0 {
        errors.at(
            field,
            "must not be empty: give the program and its arguments",
        );
    } else if count > limits::ARGV_MAX_ITEMS {
        let limit = limits::ARGV_MAX_ITEMS;
        errors.at(
            field,
            format!("must have at most {limit} items (found {count})"),
        );
    } else {
        return true;
    }
    false
}

fn check_argv_item(field: &Field, errors: &mut Errors) -> Option<String> {
    let arg = as_str(field, errors)?;
    let problem = if arg.len() > limits::ARGV_ITEM_MAX_BYTES {
        let limit = limits::ARGV_ITEM_MAX_BYTES;
        format!("must be at most {limit} bytes (found {})", arg.len())
    } else if arg.contains('\0') {
        // execve cannot pass it: the step would fail at spawn instead of here.
        "must not contain NUL".to_owned()
    } else {
        return Some(arg.to_owned());
    };
    errors.at(field, problem);
    None
}

/// A step's `env`: plain values, and variables whose value is a named secret.
#[derive(Default)]
struct Env {
    plain: Vec<(String, String)>,
    /// (variable, secret name).
    secrets: Vec<(String, String)>,
}

const SECRET_FIELDS: &[&str] = &["secret"];

fn check_env(field: &Field, errors: &mut Errors) -> Option<Env> {
    let entries = as_map(field, errors)?;
    let mut valid = true;
    if entries.len() > limits::ENV_MAX_VARS {
        let limit = limits::ENV_MAX_VARS;
        let count = entries.len();
        errors.at(
            field,
            format!("must have at most {limit} variables (found {count})"),
        );
        valid = false;
    }
    let mut env = Env::default();
    for entry in entries {
        let value = field.key(&entry.key.name, &entry.value);
        let name_ok = check_env_name(&entry.key, &value.path, errors);
        if matches!(value.node.value, Value::Map(_)) {
            let secret = as_fields(&value, SECRET_FIELDS, errors)
                .and_then(|fields| fields.required("secret", errors))
                .and_then(|field| check_secret_name(&field, errors));
            match (name_ok, secret) {
                (true, Some(secret)) => env.secrets.push((entry.key.name.clone(), secret)),
                _ => valid = false,
            }
            continue;
        }
        match (name_ok, check_env_value(&value, errors)) {
            (true, Some(text)) => env.plain.push((entry.key.name.clone(), text)),
            _ => valid = false,
        }
    }
    let total: usize = env
        .plain
        .iter()
        .chain(&env.secrets)
        .map(|(name, value)| name.len() + value.len())
        .sum();
    if total > limits::ENV_TOTAL_MAX_BYTES {
        let limit = limits::ENV_TOTAL_MAX_BYTES;
        errors.at(
            field,
            format!("names and values must total at most {limit} bytes (found {total})"),
        );
        valid = false;
    }
    valid.then_some(env)
}

fn check_env_name(key: &Key, path: &str, errors: &mut Errors) -> bool {
    let name = key.name.as_str();
    let mut chars = name.chars();
    let well_formed = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    let problem = if name.len() > limits::ENV_NAME_MAX_BYTES {
        let limit = limits::ENV_NAME_MAX_BYTES;
        format!(
            "variable names must be at most {limit} bytes (found {})",
            name.len()
        )
    } else if !well_formed {
        "variable names must match [A-Za-z_][A-Za-z0-9_]*".to_owned()
    } else if name.starts_with(RESERVED_ENV_PREFIX) {
        format!("the {RESERVED_ENV_PREFIX} prefix is reserved for variables Scarab sets")
    } else {
        return true;
    };
    errors.push(path.to_owned(), key.line, problem);
    false
}

/// A secret's name: what its file under the secrets dir (local steps) or its Kubernetes
/// Secret (Pod steps) is called. Whether it exists is checked at submit, by the service
/// that has the secrets.
fn check_secret_name(field: &Field, errors: &mut Errors) -> Option<String> {
    let name = as_str(field, errors)?;
    if crate::limits::is_secret_name(name) {
        return Some(name.to_owned());
    }
    errors.at(
        field,
        format!(
            "must be a secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most {} bytes",
            crate::limits::SECRET_NAME_MAX_BYTES
        ),
    );
    None
}

fn check_env_value(field: &Field, errors: &mut Errors) -> Option<String> {
    let value = as_str(field, errors)?;
    let problem = if value.len() > limits::ENV_VALUE_MAX_BYTES {
        let limit = limits::ENV_VALUE_MAX_BYTES;
        format!("must be at most {limit} bytes (found {})", value.len())
    } else if value.contains('\0') {
        "must not contain NUL".to_owned()
    } else {
        return Some(value.to_owned());
    };
    errors.at(field, problem);
    None
}

fn check_workdir(field: &Field, errors: &mut Errors) -> Option<String> {
    let workdir = as_str(field, errors)?;
    let problem = if workdir.is_empty() {
        "must not be empty".to_owned()
    } else if workdir.len() > limits::WORKDIR_MAX_BYTES {
        let limit = limits::WORKDIR_MAX_BYTES;
        format!("must be at most {limit} bytes (found {})", workdir.len())
    } else if workdir.contains('\0') {
        "must not contain NUL".to_owned()
    } else {
        return Some(workdir.to_owned());
    };
    errors.at(field, problem);
    None
}

// --- Retry -----------------------------------------------------------------------------

fn check_retry(field: &Field, errors: &mut Errors) -> Option<RetryPolicy> {
    let fields = as_fields(field, RETRY_FIELDS, errors)?;
    let on = fields
        .required("on", errors)
        .and_then(|field| check_retry_on(&field, errors));
    let max = fields.required("max", errors).and_then(|field| {
        let max = check_integer(&field, 0, limits::RETRY_MAX.into(), errors)?;
        u32::try_from(max).ok()
    });
    let backoff = optional(fields.get("backoff"), |field| check_backoff(field, errors));
    Some(RetryPolicy {
        on: on?,
        max: max?,
        backoff: backoff?.unwrap_or_default(),
    })
}

fn check_retry_on(field: &Field, errors: &mut Errors) -> Option<RetryOn> {
    match field.node.value {
        Value::Str(_) => check_retry_class(field, errors),
        Value::Seq(_) => check_retry_class_list(field, errors),
        _ => {
            let found = field.found();
            let message = format!("must be a failure class or a list of them (found {found})");
            errors.at(field, message);
            None
        }
    }
}

fn check_retry_class_list(field: &Field, errors: &mut Errors) -> Option<RetryOn> {
    let items = as_seq(field, "failure classes", errors)?;
    if items.is_empty() {
        errors.at(field, "must name at least one failure class");
        return None;
    }
    // Collected first so that every unknown class is reported, not just the first.
    let classes: Vec<Option<RetryOn>> = items
        .iter()
        .map(|item| check_retry_class(item, errors))
        .collect();
    classes
        .into_iter()
        .try_fold(NO_CLASS, |all, one| one.map(|one| union(all, one)))
}

fn union(a: RetryOn, b: RetryOn) -> RetryOn {
    RetryOn {
        step: a.step || b.step,
        timeout: a.timeout || b.timeout,
        infra: a.infra || b.infra,
        lost: a.lost || b.lost,
    }
}

fn check_retry_class(field: &Field, errors: &mut Errors) -> Option<RetryOn> {
    let name = as_str(field, errors)?;
    let class = RETRY_CLASSES.iter().find(|(known, _)| *known == name);
    if class.is_none() {
        let known: Vec<&str> = RETRY_CLASSES.iter().map(|(known, _)| *known).collect();
        let message = format!(
            "unknown failure class \"{name}\"; expected one of: {}",
            known.join(", ")
        );
        errors.at(field, message);
    }
    class.map(|(_, on)| *on)
}

fn check_backoff(field: &Field, errors: &mut Errors) -> Option<Backoff> {
    let fields = as_fields(field, BACKOFF_FIELDS, errors)?;
    let defaults = Backoff::default();
    let initial = optional(fields.get("initial"), |field| {
        check_duration(
            field,
            limits::BACKOFF_INITIAL_MIN,
            limits::BACKOFF_MAX_MAX,
            errors,
        )
    });
    let factor = optional(fields.get("factor"), |field| check_factor(field, errors));
    let max = optional(fields.get("max"), |field| {
        check_duration(field, Duration::ZERO, limits::BACKOFF_MAX_MAX, errors)
    });
    let backoff = Backoff {
        initial: initial?.unwrap_or(defaults.initial),
        factor: factor?.unwrap_or(defaults.factor),
        max: max?.unwrap_or(defaults.max),
    };
    check_backoff_order(&fields, &backoff, errors).then_some(backoff)
}

/// `max` must not be below `initial`; reported on `max` if written, else on `initial`
/// (whose value then exceeds the default max).
fn check_backoff_order(fields: &Fields, backoff: &Backoff, errors: &mut Errors) -> bool {
    if backoff.max >= backoff.initial {
        return true;
    }
    let initial = humantime::format_duration(backoff.initial);
    let max = humantime::format_duration(backoff.max);
    match (fields.get("max"), fields.get("initial")) {
        (Some(field), _) => errors.at(&field, format!("must be ≥ initial ({initial})")),
        (None, Some(field)) => {
            errors.at(&field, format!("must be ≤ max ({max}, the default)"));
        }
        (None, None) => {}
    }
    false
}

fn check_factor(field: &Field, errors: &mut Errors) -> Option<f64> {
    let factor = match field.node.value {
        // Rounding of huge integers is harmless: they are far beyond the limit.
        Value::Int(number) => number as f64,
        Value::Float(number) => number,
        _ => {
            errors.at(field, format!("must be a number (found {})", field.found()));
            return None;
        }
    };
    let (min, max) = (limits::BACKOFF_FACTOR_MIN, limits::BACKOFF_FACTOR_MAX);
    if factor.is_nan() || factor < min {
        errors.at(field, format!("must be ≥ {min}"));
    } else if factor > max {
        errors.at(field, format!("must be ≤ {max}"));
    } else {
        return Some(factor);
    }
    None
}

// --- Scalars ---------------------------------------------------------------------------

fn check_integer(field: &Field, min: i128, max: i128, errors: &mut Errors) -> Option<i128> {
    let Value::Int(number) = field.node.value else {
        errors.at(
            field,
            format!("must be an integer (found {})", field.found()),
        );
        return None;
    };
    if number < min {
        errors.at(field, format!("must be ≥ {min}"));
    } else if number > max {
        errors.at(field, format!("must be ≤ {max}"));
    } else {
        return Some(number);
    }
    None
}

fn check_duration(
    field: &Field,
    min: Duration,
    max: Duration,
    errors: &mut Errors,
) -> Option<Duration> {
    let Value::Str(text) = &field.node.value else {
        let found = field.found();
        errors.at(
            field,
            format!("must be a duration {DURATION_EXAMPLES} (found {found})"),
        );
        return None;
    };
    let duration = match humantime::parse_duration(text) {
        Ok(duration) => duration,
        Err(error) => {
            errors.at(
                field,
                format!("is not a duration ({error}); write it {DURATION_EXAMPLES}"),
            );
            return None;
        }
    };
    if duration < min {
        errors.at(field, format!("must be ≥ {}", human_duration(min)));
    } else if duration > max {
        errors.at(field, format!("must be ≤ {}", human_duration(max)));
    } else {
        return Some(duration);
    }
    None
}

/// A duration as a person wrote it: whole days stay days (humantime would turn 365
/// days into "11months 30days 3h 50m 24s", its months and years being averages).
fn human_duration(duration: Duration) -> String {
    const DAY_S: u64 = 24 * 3600;
    let seconds = duration.as_secs();
    if duration.subsec_nanos() == 0 && seconds >= 2 * DAY_S && seconds.is_multiple_of(DAY_S) {
        format!("{}days", seconds / DAY_S)
    } else {
        humantime::format_duration(duration).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::doc::{self, PipelineDoc};

    const RELEASE_YAML: &str = "\
name: release
steps:
  - name: deploy
    needs: [image, test]
    run: [\"./deploy.sh\", \"--prod\"]
    workdir: /srv/app
  - name: test
    run: [cargo, test]
    timeout: 20m
    env: {RUST_LOG: debug, A_FIRST: \"1\"}
    retry: {on: failure, max: 2}
  - name: image
    needs: [test]
    run: [make, image]
    retry:
      on: [step, timeout]
      max: 3
      backoff: {initial: 500ms, factor: 1.5, max: 1h30m}
";

    const RELEASE_JSON: &str = r#"{
  "name": "release",
  "steps": [
    {"name": "deploy", "needs": ["image", "test"], "run": ["./deploy.sh", "--prod"],
     "workdir": "/srv/app"},
    {"name": "test", "run": ["cargo", "test"], "timeout": "20m",
     "env": {"RUST_LOG": "debug", "A_FIRST": "1"}, "retry": {"on": "failure", "max": 2}},
    {"name": "image", "needs": ["test"], "run": ["make", "image"],
     "retry": {"on": ["step", "timeout"], "max": 3,
               "backoff": {"initial": "500ms", "factor": 1.5, "max": "1h30m"}}}
  ]
}"#;

    const APPROVAL_YAML: &str = "\
name: approval
budget: 2h
steps:
  - name: build
    run: [make]
  - name: approve
    needs: [build]
    gate:
      auto_release: 30m
      expires: 24h
      message: |
        Ship it?
        \tCheck the dashboard first.
  - name: hold
    needs: [approve]
    gate: {}
  - name: deploy
    needs: [hold]
    run: [./deploy.sh]
";

    /// Valid documents of various shapes, shared by the drift and fuzz tests.
    const VALID_YAML: &[&str] = &[
        RELEASE_YAML,
        "name: one\nsteps:\n  - name: only\n    run: [\"true\"]\n",
        "name: anchors\nsteps:\n  - {name: a, run: &cmd [make, all]}\n  - {name: b, run: *cmd, needs: [a]}\n",
        "name: yes\nsteps:\n  - name: on\n    run: [off, yes]\n    env: {FLAG: no}\n    retry:\n      on: lost\n      max: 0\n      backoff: {}\n",
        APPROVAL_YAML,
        "name: \"Nightly build ✓\"\nsteps:\n- name: A-1_b\n  run: [sh, -c, 'echo \"$X\"']\n  env:\n    X: hi\n  timeout: 1h30m\n  retry: {on: [infra, lost, step], max: 20, backoff: {factor: 10, initial: 10ms, max: 24h}}\n",
    ];

    fn parse_yaml(source: &str) -> Pipeline {
        match parse(source, Format::Yaml) {
            Ok(outcome) => outcome.pipeline,
            Err(errors) => panic!("unexpected errors: {errors:#?}"),
        }
    }

    fn yaml_errors(source: &str) -> Vec<FieldError> {
        match parse(source, Format::Yaml) {
            Ok(outcome) => panic!("accepted: {:#?}", outcome.pipeline),
            Err(errors) => errors,
        }
    }

    /// The only error of `source`, which must have exactly one.
    fn single_error(source: &str) -> FieldError {
        let errors = yaml_errors(source);
        assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
        errors.into_iter().next().unwrap_or_else(|| unreachable!())
    }

    /// A one-step pipeline whose step has the given extra YAML lines (indented 4).
    fn one_step(extra: &str) -> String {
        format!("name: p\nsteps:\n  - name: s\n    run: [x]\n{extra}")
    }

    fn assert_error(source: &str, field: &str, line: u64, message: &str) {
        let error = single_error(source);
        assert_eq!(error.field, field, "{error}");
        assert_eq!(error.line, Some(line), "{error}");
        assert!(error.message.contains(message), "{error}");
    }

    fn command(step: &Step) -> &LocalCommand {
        match &step.action {
            StepAction::Local(command) => command,
            StepAction::Kubernetes(_) | StepAction::Gate(_) => panic!("expected a local step"),
        }
    }

    // --- Valid documents ---------------------------------------------------------------

    #[test]
    fn valid_dag_maps_to_the_plain_types() {
        let pipeline = parse_yaml(RELEASE_YAML);
        assert_eq!(pipeline.name, "release");
        let [deploy, test, image] = &pipeline.steps[..] else {
            panic!("three steps expected");
        };
        assert_eq!(
            deploy.needs,
            vec![2, 1],
            "needs keep file order, forward refs allowed"
        );
        assert_eq!(image.needs, vec![1]);
        assert!(test.needs.is_empty());
        assert_eq!(command(deploy).argv, ["./deploy.sh", "--prod"]);
        assert_eq!(command(deploy).workdir.as_deref(), Some("/srv/app"));
        assert_eq!(test.timeout, Some(Duration::from_secs(20 * 60)));
        assert_eq!(deploy.timeout, None);
        let env = &command(test).env;
        assert_eq!(
            env,
            &[
                ("RUST_LOG".to_owned(), "debug".to_owned()),
                ("A_FIRST".to_owned(), "1".to_owned())
            ],
            "env keeps file order"
        );
        let retry = test.retry.as_ref().map(|r| (r.on, r.max, r.backoff));
        assert_eq!(retry, Some((RetryOn::FAILURE, 2, Backoff::default())));
        let image_retry = image.retry.unwrap_or_else(|| panic!("image has retry"));
        assert_eq!(
            image_retry.backoff,
            Backoff {
                initial: Duration::from_millis(500),
                factor: 1.5,
                max: Duration::from_secs(5400),
            }
        );
        assert_eq!(deploy.retry, None);
    }

    #[test]
    fn every_valid_example_parses_as_yaml() {
        for source in VALID_YAML {
            parse_yaml(source);
        }
    }

    #[test]
    fn on_reads_as_a_string_key_not_a_yaml_1_1_boolean() {
        let pipeline = parse_yaml(&one_step("    retry: {on: failure, max: 2}\n"));
        let retry = pipeline.steps[0].retry.unwrap_or_else(|| panic!("retry"));
        assert_eq!((retry.on, retry.max), (RetryOn::FAILURE, 2));

        let pipeline = parse_yaml(&one_step("    retry: {on: [step, timeout], max: 1}\n"));
        let on = pipeline.steps[0].retry.map(|retry| retry.on);
        let expected = RetryOn {
            step: true,
            timeout: true,
            infra: false,
            lost: false,
        };
        assert_eq!(on, Some(expected));

        let pipeline = parse_yaml(&one_step("    retry:\n      on: infra\n      max: 0\n"));
        assert_eq!(pipeline.steps[0].retry.map(|r| r.on.infra), Some(true));
    }

    #[test]
    fn yaml_1_1_boolean_words_are_plain_strings() {
        let pipeline = parse_yaml(VALID_YAML[3]);
        assert_eq!(pipeline.name, "yes");
        assert_eq!(pipeline.steps[0].name, "on");
        assert_eq!(command(&pipeline.steps[0]).argv, ["off", "yes"]);
        assert_eq!(command(&pipeline.steps[0]).env[0].1, "no");
    }

    #[test]
    fn json_input_is_equivalent_to_yaml() {
        let from_json = match parse(RELEASE_JSON, Format::Json) {
            Ok(outcome) => outcome,
            Err(errors) => panic!("{errors:#?}"),
        };
        let from_yaml = parse(RELEASE_YAML, Format::Yaml);
        assert_eq!(Ok(from_json), from_yaml);
    }

    #[test]
    fn warning_is_present_iff_a_step_has_retry() {
        let with = parse(RELEASE_YAML, Format::Yaml).map(|outcome| outcome.warnings);
        assert_eq!(
            with,
            Ok(vec![retry_warning().to_owned()]),
            "once, however many steps"
        );
        let without = parse(VALID_YAML[1], Format::Yaml).map(|outcome| outcome.warnings);
        assert_eq!(without, Ok(Vec::new()));
    }

    #[test]
    fn retry_warning_text_is_exact() {
        assert_eq!(
            retry_warning(),
            "retry re-runs the whole step at-least-once; enable it only if the step is \
             idempotent or fenced against a cooperating sink"
        );
    }

    // --- One error of each kind, with its path and line -----------------------------------

    #[test]
    fn unknown_field_names_its_path_and_suggests() {
        let source = "name: p\nsteps:\n  - name: a\n    run: [x]\n  - name: b\n    run: [x]\n    retyr: {on: step, max: 1}\n";
        let error = single_error(source);
        assert_eq!(
            error.to_string().split(':').next(),
            Some("steps[1].retyr (line 7)")
        );
        assert!(
            error
                .message
                .starts_with("unknown field (did you mean \"retry\"?)")
        );
        assert!(error.message.contains(
            "known fields: name, executor, run, needs, timeout, env, workdir, retry, image"
        ));
        assert_error(
            &format!("{}timeout: 2h\n", one_step("")),
            "timeout",
            5,
            "known fields: name, budget, priority, parallelism, concurrency, kubernetes, steps",
        );
    }

    #[test]
    fn type_errors_name_what_was_found() {
        assert_error(
            &one_step("    timeout: 20\n"),
            "steps[0].timeout",
            5,
            "must be a duration",
        );
        assert_error(
            &one_step("    env: {N: 1}\n"),
            "steps[0].env.N",
            5,
            "must be a string (found an integer)",
        );
        assert_error(
            &one_step("    env: {N: true}\n"),
            "steps[0].env.N",
            5,
            "must be a string (found a boolean)",
        );
        assert_error(
            &one_step("    env: [a]\n"),
            "steps[0].env",
            5,
            "must be a mapping (found a list)",
        );
        assert_error(
            &one_step("    needs: a\n"),
            "steps[0].needs",
            5,
            "must be a list of step names",
        );
        assert_error(
            &one_step("    workdir:\n"),
            "steps[0].workdir",
            5,
            "must be a string (found null)",
        );
        assert_error(
            "name: p\nsteps:\n  - name: s\n    run: cargo test\n",
            "steps[0].run",
            4,
            "must be a list of strings",
        );
        assert_error(
            "name: p\nsteps:\n  - name: s\n    run: [sleep, 5]\n",
            "steps[0].run[1]",
            4,
            "must be a string",
        );
        assert_error(
            "name: p\nsteps: {a: 1}\n",
            "steps",
            2,
            "must be a list of steps",
        );
        assert_error(
            "name: [p]\nsteps:\n  - {name: s, run: [x]}\n",
            "name",
            1,
            "must be a string",
        );
        assert_error(
            &one_step("    retry: {on: step, max: \"2\"}\n"),
            "steps[0].retry.max",
            5,
            "must be an integer (found a string)",
        );
        assert_error(
            &one_step("    retry: {on: step, max: 2, backoff: {factor: x}}\n"),
            "steps[0].retry.backoff.factor",
            5,
            "must be a number",
        );
    }

    #[test]
    fn missing_required_fields_point_at_their_mapping() {
        assert_error(
            "steps:\n  - {name: s, run: [x]}\n",
            "name",
            1,
            "required field missing",
        );
        assert_error(
            "name: p\nsteps:\n  - name: s\n    env: {}\n",
            "steps[0].run",
            3,
            "required field missing",
        );
        assert_error(
            &one_step("    retry:\n      max: 2\n"),
            "steps[0].retry.on",
            6,
            "required field missing",
        );
    }

    #[test]
    fn names_are_checked() {
        assert_error(
            "name: \"\"\nsteps:\n  - {name: s, run: [x]}\n",
            "name",
            1,
            "must not be empty",
        );
        assert_error(
            "name: \"a\\tb\"\nsteps:\n  - {name: s, run: [x]}\n",
            "name",
            1,
            "control or bidirectional characters",
        );
        assert_error(
            "name: \"invoice\\u202Efdp.exe\"\nsteps:\n  - {name: s, run: [x]}\n",
            "name",
            1,
            "(found U+202E)",
        );
        assert_error(
            "name: p\nsteps:\n  - {name: a b, run: [x]}\n",
            "steps[0].name",
            3,
            "letters, digits",
        );
        let source = "name: p\nsteps:\n  - {name: a, run: [x]}\n  - {name: b, run: [x]}\n  - {name: a, run: [x]}\n";
        assert_error(
            source,
            "steps[2].name",
            5,
            "duplicate step name \"a\" (first used by steps[0])",
        );
    }

    #[test]
    fn needs_are_resolved() {
        let step =
            |name: &str, needs: &str| format!("  - {{name: {name}, run: [x], needs: {needs}}}\n");
        let doc = |steps: &[String]| format!("name: p\nsteps:\n{}", steps.concat());
        assert_error(
            &doc(&[step("test", "[]"), step("b", "[tset]")]),
            "steps[1].needs[0]",
            4,
            "unknown step \"tset\" (did you mean \"test\"?)",
        );
        assert_error(
            &doc(&[step("a", "[a]")]),
            "steps[0].needs[0]",
            3,
            "cannot need itself",
        );
        assert_error(
            &doc(&[step("a", "[]"), step("b", "[a, a]")]),
            "steps[1].needs[1]",
            4,
            "listed twice",
        );
    }

    #[test]
    fn cycle_error_names_the_steps_in_the_cycle() {
        let source = "name: p\nsteps:\n  - name: a\n    run: [x]\n    needs: [c]\n  - {name: b, run: [x], needs: [a]}\n  - {name: c, run: [x], needs: [b]}\n  - {name: d, run: [x], needs: [a]}\n";
        let error = single_error(source);
        assert_eq!(error.field, "steps[0].needs");
        assert_eq!(error.line, Some(5));
        assert_eq!(
            error.message,
            "dependency cycle: a → c → b → a (each needs the next)"
        );

        let two_cycles = "name: p\nsteps:\n  - {name: a, run: [x], needs: [b]}\n  - {name: b, run: [x], needs: [a]}\n  - {name: c, run: [x], needs: [d]}\n  - {name: d, run: [x], needs: [c]}\n";
        let fields: Vec<String> = yaml_errors(two_cycles)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            ["steps[0].needs", "steps[2].needs"],
            "one error per cycle"
        );
    }

    #[test]
    fn commands_are_checked() {
        assert_error(
            "name: p\nsteps:\n  - {name: s, run: []}\n",
            "steps[0].run",
            3,
            "must not be empty",
        );
        assert_error(
            "name: p\nsteps:\n  - {name: s, run: [\"\", x]}\n",
            "steps[0].run[0]",
            3,
            "program must not be empty",
        );
        assert_error(
            "name: p\nsteps:\n  - {name: s, run: [\"a\\0b\"]}\n",
            "steps[0].run[0]",
            3,
            "NUL",
        );
        assert_error(
            &one_step("    workdir: \"\"\n"),
            "steps[0].workdir",
            5,
            "must not be empty",
        );
        assert_error(
            &one_step("    workdir: \"/a\\0\"\n"),
            "steps[0].workdir",
            5,
            "NUL",
        );
    }

    #[test]
    fn a_secret_reference_is_kept_apart_from_plain_values() {
        let pipeline = parse_yaml(&one_step(
            "    env:\n      PLAIN: text\n      API_KEY: {secret: registry-key}\n",
        ));
        let command = command(&pipeline.steps[0]);
        assert_eq!(command.env, vec![("PLAIN".to_string(), "text".to_string())]);
        assert_eq!(
            command.secrets,
            vec![("API_KEY".to_string(), "registry-key".to_string())]
        );
        assert_error(
            &one_step("    env:\n      API_KEY: {secret: Bad_Name}\n"),
            "steps[0].env.API_KEY.secret",
            6,
            "must be a secret name",
        );
        assert_error(
            &one_step("    env:\n      API_KEY: {secret: k, key: x}\n"),
            "steps[0].env.API_KEY.key",
            6,
            "unknown",
        );
    }

    #[test]
    fn env_names_are_checked() {
        assert_error(
            &one_step("    env:\n      SCARAB_RUN_ID: x\n"),
            "steps[0].env.SCARAB_RUN_ID",
            6,
            "reserved",
        );
        assert_error(
            &one_step("    env:\n      1A: x\n"),
            "steps[0].env.1A",
            6,
            "[A-Za-z_][A-Za-z0-9_]*",
        );
        assert_error(
            &one_step("    env:\n      A-B: x\n"),
            "steps[0].env.A-B",
            6,
            "[A-Za-z_][A-Za-z0-9_]*",
        );
        assert_error(
            &one_step("    env:\n      A: x\n      A: y\n"),
            "steps[0].env.A",
            7,
            "duplicate key",
        );
    }

    #[test]
    fn durations_are_checked() {
        assert_error(
            &one_step("    timeout: soon\n"),
            "steps[0].timeout",
            5,
            "is not a duration",
        );
        assert_error(
            &one_step("    timeout: 500ms\n"),
            "steps[0].timeout",
            5,
            "must be ≥ 1s",
        );
        assert_error(
            &one_step("    timeout: 8days\n"),
            "steps[0].timeout",
            5,
            "must be ≤ 7days",
        );
        parse_yaml(&one_step("    timeout: 1s\n"));
        parse_yaml(&one_step("    timeout: 7days\n"));
    }

    #[test]
    fn retry_is_checked() {
        let retry = |body: &str| one_step(&format!("    retry:\n{body}"));
        assert_error(
            &retry("      on: step\n      max: 21\n"),
            "steps[0].retry.max",
            7,
            "must be ≤ 20",
        );
        assert_error(
            &retry("      on: step\n      max: -1\n"),
            "steps[0].retry.max",
            7,
            "must be ≥ 0",
        );
        assert_error(
            &retry("      on: always\n      max: 1\n"),
            "steps[0].retry.on",
            6,
            "unknown failure class \"always\"",
        );
        assert_error(
            &retry("      on: [step, bogus]\n      max: 1\n"),
            "steps[0].retry.on[1]",
            6,
            "unknown failure class",
        );
        assert_error(
            &retry("      on: []\n      max: 1\n"),
            "steps[0].retry.on",
            6,
            "at least one",
        );
        assert_error(
            &retry("      on: 3\n      max: 1\n"),
            "steps[0].retry.on",
            6,
            "a failure class or a list",
        );
    }

    #[test]
    fn backoff_is_checked() {
        let backoff = |body: &str| {
            one_step(&format!(
                "    retry:\n      on: step\n      max: 1\n      backoff:\n{body}"
            ))
        };
        let path = "steps[0].retry.backoff";
        assert_error(
            &backoff("        factor: 11\n"),
            &format!("{path}.factor"),
            9,
            "must be ≤ 10",
        );
        assert_error(
            &backoff("        factor: 0.5\n"),
            &format!("{path}.factor"),
            9,
            "must be ≥ 1",
        );
        assert_error(
            &backoff("        initial: 5ms\n"),
            &format!("{path}.initial"),
            9,
            "must be ≥ 10ms",
        );
        assert_error(
            &backoff("        max: 2days\n"),
            &format!("{path}.max"),
            9,
            "must be ≤ 1day",
        );
        assert_error(
            &backoff("        initial: 1m\n        max: 30s\n"),
            &format!("{path}.max"),
            10,
            "must be ≥ initial (1m)",
        );
        assert_error(
            &backoff("        initial: 1h\n"),
            &format!("{path}.initial"),
            9,
            "must be ≤ max (10m, the default)",
        );
        assert_error(
            &backoff("        jitter: 1\n"),
            &format!("{path}.jitter"),
            9,
            "known fields: initial, factor, max",
        );
    }

    // --- All errors at once, ordering and display ----------------------------------------

    #[test]
    fn every_error_is_reported_at_once() {
        let source = "\
name: p
steps:
  - name: a
    run: [x]
    timeout: forever
  - name: b
    run: [x]
    needs: [nope]
    retry: {on: step, max: 99}
";
        let errors = yaml_errors(source);
        let found: Vec<(&str, Option<u64>)> =
            errors.iter().map(|e| (e.field.as_str(), e.line)).collect();
        assert_eq!(
            found,
            [
                ("steps[0].timeout", Some(5)),
                ("steps[1].needs[0]", Some(8)),
                ("steps[1].retry.max", Some(9)),
            ]
        );
    }

    #[test]
    fn errors_are_sorted_by_line_then_field() {
        let source = "name: p\nsteps:\n  - {name: a, run: [x], timeout: x, env: {SCARAB_A: x}, retyr: 1}\n  - name: b\n";
        let errors = yaml_errors(source);
        let found: Vec<(&str, Option<u64>)> =
            errors.iter().map(|e| (e.field.as_str(), e.line)).collect();
        assert_eq!(
            found,
            [
                ("steps[0].env.SCARAB_A", Some(3)),
                ("steps[0].retyr", Some(3)),
                ("steps[0].timeout", Some(3)),
                ("steps[1].run", Some(4)),
            ]
        );
    }

    #[test]
    fn json_errors_have_no_line_and_sort_indices_numerically() {
        let steps: Vec<String> = (0..12)
            .map(|i| format!(r#"{{"name": "s{i}", "run": ["x"], "timeout": 1}}"#))
            .collect();
        let source = format!(r#"{{"name": "p", "steps": [{}]}}"#, steps.join(","));
        let errors = parse(&source, Format::Json).err().unwrap_or_default();
        assert_eq!(errors.len(), 12);
        assert!(errors.iter().all(|error| error.line.is_none()));
        assert_eq!(errors[2].field, "steps[2].timeout");
        assert_eq!(errors[10].field, "steps[10].timeout");
    }

    #[test]
    fn field_error_display() {
        let error = |field: &str, line| FieldError {
            field: field.to_owned(),
            line,
            message: "must be ≤ 20".to_owned(),
        };
        assert_eq!(
            error("steps[2].retry.max", Some(7)).to_string(),
            "steps[2].retry.max (line 7): must be ≤ 20"
        );
        assert_eq!(
            error("steps[2].retry.max", None).to_string(),
            "steps[2].retry.max: must be ≤ 20"
        );
        assert_eq!(error("", Some(3)).to_string(), "line 3: must be ≤ 20");
        assert_eq!(error("", None).to_string(), "must be ≤ 20");
    }

    // --- Limits ------------------------------------------------------------------------

    fn steps_yaml(count: usize) -> String {
        let steps: String = (0..count)
            .map(|i| format!("  - {{name: s{i}, run: [x]}}\n"))
            .collect();
        format!("name: p\nsteps:\n{steps}")
    }

    #[test]
    fn step_count_is_limited() {
        parse_yaml(&steps_yaml(limits::STEPS_MAX));
        let error = single_error(&steps_yaml(limits::STEPS_MAX + 1));
        assert_eq!(error.field, "steps");
        assert_eq!(error.message, "must have at most 100 steps (found 101)");
        assert_error("name: p\nsteps: []\n", "steps", 2, "at least one step");
    }

    #[test]
    fn name_lengths_are_limited() {
        let pipeline_name = |n: usize| {
            format!(
                "name: {}\nsteps:\n  - {{name: s, run: [x]}}\n",
                "é".repeat(n)
            )
        };
        parse_yaml(&pipeline_name(limits::PIPELINE_NAME_MAX_CHARS));
        assert_error(
            &pipeline_name(limits::PIPELINE_NAME_MAX_CHARS + 1),
            "name",
            1,
            "at most 100 characters (found 101)",
        );
        let step_name = |n: usize| {
            format!(
                "name: p\nsteps:\n  - {{name: {}, run: [x]}}\n",
                "s".repeat(n)
            )
        };
        parse_yaml(&step_name(limits::STEP_NAME_MAX_CHARS));
        assert_error(
            &step_name(limits::STEP_NAME_MAX_CHARS + 1),
            "steps[0].name",
            3,
            "at most 63 characters",
        );
    }

    #[test]
    fn retry_max_21_is_refused_with_the_documented_message() {
        let error = single_error(&one_step("    retry: {on: failure, max: 21}\n"));
        assert_eq!(error.field, "steps[0].retry.max");
        assert_eq!(error.message, "must be ≤ 20");
        assert_eq!(
            error.to_string(),
            "steps[0].retry.max (line 5): must be ≤ 20"
        );
        parse_yaml(&one_step("    retry: {on: failure, max: 20}\n"));
    }

    #[test]
    fn argv_and_env_sizes_are_limited() {
        let items = |n: usize| vec!["a"; n].join(", ");
        let run = |n: usize| format!("name: p\nsteps:\n  - {{name: s, run: [{}]}}\n", items(n));
        parse_yaml(&run(limits::ARGV_MAX_ITEMS));
        assert_error(
            &run(limits::ARGV_MAX_ITEMS + 1),
            "steps[0].run",
            3,
            "at most 256 items",
        );
        let long = "a".repeat(limits::ARGV_ITEM_MAX_BYTES + 1);
        assert_error(
            &format!("name: p\nsteps:\n  - {{name: s, run: [{long}]}}\n"),
            "steps[0].run[0]",
            3,
            "at most 4096 bytes",
        );
        let big = "a".repeat(limits::ARGV_ITEM_MAX_BYTES);
        let total = vec![big.as_str(); 17].join(", ");
        assert_error(
            &format!("name: p\nsteps:\n  - {{name: s, run: [{total}]}}\n"),
            "steps[0].run",
            3,
            "total at most 65536 bytes",
        );

        let vars = |n: usize| {
            (0..n)
                .map(|i| format!("V{i}: x"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let env = |n: usize| one_step(&format!("    env: {{{}}}\n", vars(n)));
        parse_yaml(&env(limits::ENV_MAX_VARS));
        assert_error(
            &env(limits::ENV_MAX_VARS + 1),
            "steps[0].env",
            5,
            "at most 100 variables",
        );
        let value = "v".repeat(limits::ENV_VALUE_MAX_BYTES + 1);
        assert_error(
            &one_step(&format!("    env: {{A: {value}}}\n")),
            "steps[0].env.A",
            5,
            "at most 4096 bytes",
        );
        let name = "N".repeat(limits::ENV_NAME_MAX_BYTES + 1);
        assert_error(
            &one_step(&format!("    env: {{{name}: x}}\n")),
            &format!("steps[0].env.{name}"),
            5,
            "at most 128 bytes",
        );
    }

    #[test]
    fn oversized_documents_are_refused_before_parsing() {
        let source = format!("name: p\n#{}\n", "x".repeat(limits::PIPELINE_MAX_BYTES));
        let error = single_error(&source);
        assert_eq!((error.field.as_str(), error.line), ("", None));
        assert!(error.message.contains("at most 262144"), "{error}");
    }

    // --- Whole-document problems -----------------------------------------------------------

    #[test]
    fn yaml_syntax_error_is_one_document_error_with_its_line() {
        let error = single_error("name: p\nsteps:\n  - name: a\n    run: [x\n  bad: : :\n");
        assert_eq!(error.field, "");
        assert!(error.line.is_some_and(|line| line >= 4), "{error}");
        assert!(error.message.starts_with("invalid YAML: "), "{error}");
        assert_eq!(single_error("name: x\n  bad: : :\n").line, Some(2));
    }

    #[test]
    fn json_syntax_error_has_its_line() {
        let errors = parse("{\"name\": \"p\",\n \"steps\": [,]}", Format::Json).err();
        let error = errors.and_then(|errors| errors.into_iter().next());
        let error = error.unwrap_or_else(|| panic!("expected an error"));
        assert_eq!((error.field.as_str(), error.line), ("", Some(2)));
        assert!(error.message.starts_with("invalid JSON: "), "{error}");
        assert!(
            !error.message.contains("column"),
            "position is not repeated: {error}"
        );
    }

    #[test]
    fn empty_and_non_mapping_documents_are_refused() {
        for source in ["", "  \n", "# only a comment\n", "~\n"] {
            assert_eq!(
                single_error(source).message,
                "the document is empty",
                "{source:?}"
            );
        }
        for source in ["- a\n", "hello\n", "42\n"] {
            let error = single_error(source);
            assert!(
                error.message.starts_with("the document must be a mapping"),
                "{error}"
            );
        }
        let json = parse("[1]", Format::Json).err().unwrap_or_default();
        assert_eq!(json.len(), 1);
        assert!(
            json[0]
                .message
                .starts_with("the document must be a mapping")
        );
    }

    #[test]
    fn duplicate_keys_are_reported_with_their_path() {
        assert_error(
            "name: p\nname: q\nsteps:\n  - {name: s, run: [x]}\n",
            "name",
            2,
            "duplicate key",
        );
        let json = r#"{"name": "p", "steps": [{"name": "s", "run": ["x"], "run": ["y"]}]}"#;
        let errors = parse(json, Format::Json).err().unwrap_or_default();
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["steps[0].run"]);
    }

    #[test]
    fn nesting_up_to_the_limit_is_not_a_document_error() {
        // The root mapping is level 1, `steps` level 2.
        let inner = limits::PIPELINE_MAX_DEPTH - 1;
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let yaml = yaml_errors(&format!("name: p\nsteps: {}\n", nested(inner)));
        let json = format!(r#"{{"name": "p", "steps": {}}}"#, nested(inner));
        let json = parse(&json, Format::Json).err().unwrap_or_default();
        for errors in [yaml, json] {
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_eq!(errors[0].field, "steps[0]", "{errors:?}");
        }
        let yaml = single_error(&format!("name: p\nsteps: {}\n", nested(inner + 1)));
        assert_eq!(yaml.field, "");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let depth = limits::PIPELINE_MAX_DEPTH + 8;
        let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let error = single_error(&format!("name: p\nsteps: {nested}\n"));
        assert_eq!(error.field, "");
        assert!(error.message.contains("too complex"), "{error}");
        for depth in [depth, 5000] {
            let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let json = format!(r#"{{"name": "p", "steps": {nested}}}"#);
            let errors = parse(&json, Format::Json).err().unwrap_or_default();
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_eq!(errors[0].field, "");
        }
        let block: String = (0..depth)
            .map(|i| format!("{}- \n", "  ".repeat(i)))
            .collect();
        assert_eq!(single_error(&format!("name: p\nsteps:\n{block}")).field, "");
    }

    #[test]
    fn alias_bombs_are_bounded() {
        let mut source = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..10 {
            let refs = vec![format!("*a{}", level - 1); 10].join(", ");
            source.push_str(&format!("a{level}: &a{level} [{refs}]\n"));
        }
        let error = single_error(&source);
        assert_eq!(error.field, "");
        assert!(error.message.starts_with("invalid YAML: "), "{error}");
    }

    #[test]
    fn unsupported_tags_and_multiple_documents_are_refused() {
        assert_eq!(single_error("name: !secret p\nsteps: []\n").field, "");
        assert_eq!(single_error("name: p\n---\nname: q\n").field, "");
    }

    // --- Robustness ----------------------------------------------------------------------

    /// Variants of a valid document: every prefix, every single-character substitution
    /// from a set of structural characters, and every line dropped.
    fn mutations(source: &str) -> Vec<String> {
        let mut variants: Vec<String> = source
            .char_indices()
            .map(|(at, _)| source[..at].to_owned())
            .collect();
        for (at, c) in source.char_indices() {
            for replacement in [
                '"', '\'', ':', '-', '[', '{', '&', '*', '\n', ' ', '\t', '0', '!', '#',
            ] {
                let mut variant = source.to_owned();
                variant.replace_range(at..at + c.len_utf8(), &replacement.to_string());
                variants.push(variant);
            }
        }
        let lines: Vec<&str> = source.lines().collect();
        for skip in 0..lines.len() {
            let kept: Vec<&str> = lines
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != skip)
                .map(|(_, l)| *l)
                .collect();
            variants.push(kept.join("\n"));
        }
        variants
    }

    #[test]
    fn mutated_documents_never_panic() {
        let mut count = 0;
        for (source, format) in [(RELEASE_YAML, Format::Yaml), (RELEASE_JSON, Format::Json)] {
            for variant in mutations(source) {
                let outcome = std::panic::catch_unwind(|| parse(&variant, format));
                assert!(outcome.is_ok(), "panicked on {variant:?}");
                count += 1;
            }
        }
        assert!(count > 10_000, "only {count} variants");
    }

    #[test]
    fn hostile_documents_near_the_size_limit_are_handled() {
        // Thousands of steps whose needs are all unknown: the quadratic checks are skipped.
        let step = |i: usize| format!("  - {{name: s{i}, run: [x], needs: [t{i}]}}\n");
        let mut source = String::from("name: p\nsteps:\n");
        for i in 0.. {
            if source.len() > 200_000 {
                break;
            }
            source.push_str(&step(i));
        }
        let errors = yaml_errors(&source);
        assert_eq!(errors.len(), 1, "only the step count: {:?}", errors.first());
        // Two long names one edit apart: no quadratic suggestion search on them.
        let long = "n".repeat(100_000);
        let source = format!(
            "name: p\nsteps:\n  - {{name: {long}a, run: [x]}}\n  - {{name: b, run: [x], needs: [{long}b]}}\n"
        );
        let fields: Vec<String> = yaml_errors(&source).into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["steps[0].name", "steps[1].needs[0]"]);
    }

    // --- Agreement with the doc types and the schema -----------------------------------------

    fn schema_object<'a>(
        schema: &'a serde_json::Value,
        definition: Option<&str>,
    ) -> &'a serde_json::Value {
        match definition {
            None => schema,
            Some(name) => &schema["$defs"][name],
        }
    }

    fn schema_properties(schema: &serde_json::Value, definition: Option<&str>) -> Vec<String> {
        let properties = schema_object(schema, definition)["properties"].as_object();
        let mut names: Vec<String> = properties
            .into_iter()
            .flat_map(|p| p.keys().cloned())
            .collect();
        names.sort();
        names
    }

    fn sorted(fields: &[&str]) -> Vec<String> {
        let mut fields: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
        fields.sort();
        fields
    }

    #[test]
    fn schema_has_title_and_top_level_properties() {
        let schema = doc::json_schema();
        assert_eq!(schema["title"], "Scarab pipeline");
        assert_eq!(schema["properties"]["name"]["type"], "string");
        assert_eq!(schema["properties"]["steps"]["type"], "array");
        assert!(schema["properties"]["steps"]["description"].is_string());
    }

    #[test]
    fn walker_fields_equal_schema_properties() {
        let schema = doc::json_schema();
        for (definition, fields) in [
            (None, PIPELINE_FIELDS),
            (Some("StepDoc"), STEP_FIELDS),
            (Some("RetryDoc"), RETRY_FIELDS),
            (Some("BackoffDoc"), BACKOFF_FIELDS),
            (Some("KubernetesDoc"), KUBERNETES_FIELDS),
            (Some("ResourcesDoc"), RESOURCES_FIELDS),
            (Some("GateDoc"), GATE_FIELDS),
            (Some("ConcurrencyDoc"), CONCURRENCY_FIELDS),
        ] {
            assert_eq!(
                schema_properties(&schema, definition),
                sorted(fields),
                "{definition:?}"
            );
            let object = schema_object(&schema, definition);
            assert_eq!(object["additionalProperties"], false, "{definition:?}");
        }
    }

    #[test]
    fn walker_retry_classes_equal_schema_enum() {
        let schema = doc::json_schema();
        let variants = schema["$defs"]["RetryClassDoc"]["oneOf"].as_array();
        let mut in_schema: Vec<String> = variants
            .into_iter()
            .flatten()
            .filter_map(|variant| variant["const"].as_str().map(str::to_owned))
            .collect();
        in_schema.sort();
        let walker: Vec<&str> = RETRY_CLASSES.iter().map(|(name, _)| *name).collect();
        assert_eq!(in_schema, sorted(&walker));
    }

    #[test]
    fn schema_limits_come_from_the_limits_module() {
        let schema = doc::json_schema();
        let step = &schema["$defs"]["StepDoc"]["properties"];
        assert_eq!(schema["properties"]["steps"]["maxItems"], limits::STEPS_MAX);
        assert_eq!(
            schema["properties"]["name"]["maxLength"],
            limits::PIPELINE_NAME_MAX_CHARS
        );
        assert_eq!(step["name"]["maxLength"], limits::STEP_NAME_MAX_CHARS);
        assert_eq!(step["run"]["maxItems"], limits::ARGV_MAX_ITEMS);
        assert_eq!(
            schema["$defs"]["RetryDoc"]["properties"]["max"]["maximum"],
            limits::RETRY_MAX
        );
        // The prose quotes the same numbers.
        let described = |value: &serde_json::Value| {
            value["description"].as_str().unwrap_or_default().to_owned()
        };
        assert!(described(&schema["properties"]["steps"]).contains(&limits::STEPS_MAX.to_string()));
        assert!(described(&step["name"]).contains(&limits::STEP_NAME_MAX_CHARS.to_string()));
        assert!(described(&step["env"]).contains(&limits::ENV_MAX_VARS.to_string()));
        assert!(described(&step["run"]).contains(&limits::ARGV_MAX_ITEMS.to_string()));
    }

    #[test]
    fn valid_documents_deserialize_into_the_doc_types() {
        let from_json: Result<PipelineDoc, _> = serde_json::from_str(RELEASE_JSON);
        assert!(from_json.is_ok(), "{from_json:?}");
        for source in VALID_YAML {
            // Through serde_json too: the YAML → JSON value → doc types route.
            let value: Result<serde_json::Value, _> =
                serde_saphyr::from_str_with_options(source, yaml_options());
            let value = value.unwrap_or_else(|error| panic!("{error}"));
            let doc: Result<PipelineDoc, _> = serde_json::from_value(value);
            assert!(doc.is_ok(), "{source}: {doc:?}");
        }
    }

    #[test]
    fn documents_the_walker_refuses_for_unknown_fields_the_doc_types_refuse_too() {
        let source = r#"{"name": "p", "steps": [{"name": "s", "run": ["x"], "retry": {"on": "step", "max": 1, "bakoff": {}}}]}"#;
        assert!(parse(source, Format::Json).is_err());
        assert!(serde_json::from_str::<PipelineDoc>(source).is_err());
    }

    // --- Kubernetes steps ---------------------------------------------------------------

    #[test]
    fn kubernetes_steps_take_pod_fields_and_pipeline_defaults() {
        let pipeline = parse_yaml(
            "name: k\nkubernetes:\n  image: alpine:3\n  service_account: builder\n  node_selector: {pool: ci}\nsteps:\n  - name: a\n    executor: kubernetes\n    command: [sh, -c]\n    args: ['echo hi']\n    resources: {requests: {cpu: 500m}, limits: {memory: 1Gi}}\n  - name: b\n    executor: kubernetes\n    image: busybox\n    node_selector: {kubernetes.io/arch: amd64}\n",
        );
        let StepAction::Kubernetes(a) = &pipeline.steps[0].action else {
            panic!("a kubernetes step")
        };
        assert_eq!(a.image, "alpine:3");
        assert_eq!(a.command, vec!["sh", "-c"]);
        assert_eq!(a.args, vec!["echo hi"]);
        assert_eq!(
            a.resources.requests,
            vec![("cpu".to_string(), "500m".to_string())]
        );
        assert_eq!(
            a.resources.limits,
            vec![("memory".to_string(), "1Gi".to_string())]
        );
        assert_eq!(a.service_account.as_deref(), Some("builder"));
        assert_eq!(
            a.node_selector,
            vec![("pool".to_string(), "ci".to_string())]
        );
        let StepAction::Kubernetes(b) = &pipeline.steps[1].action else {
            panic!("a kubernetes step")
        };
        assert_eq!(b.image, "busybox");
        assert_eq!(
            b.node_selector,
            vec![("kubernetes.io/arch".to_string(), "amd64".to_string())]
        );
    }

    #[test]
    fn kubernetes_and_local_fields_do_not_mix() {
        let errors = parse(
            "name: k\nsteps:\n  - name: a\n    executor: kubernetes\n    run: [x]\n  - name: b\n    run: [x]\n    image: alpine\n  - name: c\n    executor: docker\n    run: [x]\n  - name: d\n    executor: kubernetes\n    image: alpine\n    service_account: Bad_Name\n    node_selector: {'-bad': x}\n",
            Format::Yaml,
        )
        .expect_err("invalid");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"steps[0].image"), "{errors:?}");
        assert!(fields.contains(&"steps[0].run"), "{errors:?}");
        assert!(fields.contains(&"steps[1].image"), "{errors:?}");
        assert!(fields.contains(&"steps[2].executor"), "{errors:?}");
        assert!(fields.contains(&"steps[3].service_account"), "{errors:?}");
        assert!(
            fields.contains(&"steps[3].node_selector.-bad"),
            "{errors:?}"
        );
    }

    #[test]
    fn output_references_must_name_a_needed_step() {
        let ok = "name: o\nsteps:\n  - name: a\n    run: [x]\n  - name: b\n    needs: [a]\n    run: [x]\n  - name: c\n    needs: [b]\n    run: [x]\n    env: {D: 'v=${steps.a.outputs.digest}'}\n";
        assert!(
            parse(ok, Format::Yaml).is_ok(),
            "a step needed through another is fine"
        );
        let bad = "name: o\nsteps:\n  - name: a\n    run: [x]\n  - name: b\n    run: [x]\n    env: {D: '${steps.a.outputs.digest}', E: '${steps.zz.outputs.x}'}\n";
        let errors = parse(bad, Format::Yaml).expect_err("invalid");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"steps[1].env.D"), "{errors:?}");
        assert!(fields.contains(&"steps[1].env.E"), "{errors:?}");
    }

    // --- Budgets and gates -----------------------------------------------------------------

    /// A pipeline with a step `s` and, after it, a gate step `g` with the extra lines.
    fn gate_step(extra: &str) -> String {
        format!("name: p\nsteps:\n  - name: s\n    run: [x]\n  - name: g\n    needs: [s]\n{extra}")
    }

    #[test]
    fn budget_and_gates_map_to_the_plain_types() {
        let pipeline = parse_yaml(APPROVAL_YAML);
        assert_eq!(pipeline.budget, Some(Duration::from_secs(2 * 3600)));
        let [build, approve, hold, deploy] = &pipeline.steps[..] else {
            panic!("four steps expected");
        };
        assert_eq!(build.action.gate(), None);
        assert_eq!(approve.needs, vec![0]);
        assert_eq!(approve.timeout, None);
        assert_eq!(approve.retry, None);
        assert_eq!(approve.action.executor_name(), "gate");
        assert_eq!(
            approve.action.gate(),
            Some(&GateSpec {
                auto_release: Some(Duration::from_secs(30 * 60)),
                expires: Some(Duration::from_secs(24 * 3600)),
                message: Some("Ship it?\n\tCheck the dashboard first.\n".to_owned()),
            })
        );
        assert_eq!(hold.needs, vec![1]);
        assert_eq!(hold.action, StepAction::Gate(GateSpec::default()));
        assert_eq!(deploy.needs, vec![2]);
        assert_eq!(command(deploy).argv, ["./deploy.sh"]);
        assert_eq!(parse_yaml(VALID_YAML[1]).budget, None);
    }

    #[test]
    fn budget_and_gates_read_the_same_from_json() {
        let json = r#"{"name": "approval", "budget": "2h", "steps": [
            {"name": "build", "run": ["make"]},
            {"name": "approve", "needs": ["build"], "gate": {"auto_release": "30m",
             "expires": "24h", "message": "Ship it?\n\tCheck the dashboard first.\n"}},
            {"name": "hold", "needs": ["approve"], "gate": {}},
            {"name": "deploy", "needs": ["hold"], "run": ["./deploy.sh"]}]}"#;
        let from_json = parse(json, Format::Json).map(|outcome| outcome.pipeline);
        assert_eq!(from_json, Ok(parse_yaml(APPROVAL_YAML)));
    }

    #[test]
    fn budget_is_bounded() {
        let budget =
            |value: &str| format!("name: p\nbudget: {value}\nsteps:\n  - name: s\n    run: [x]\n");
        assert_error(&budget("500ms"), "budget", 2, "must be ≥ 1s");
        assert_error(&budget("31days"), "budget", 2, "must be ≤ 30days");
        assert_error(&budget("soon"), "budget", 2, "is not a duration");
        assert_error(&budget("10"), "budget", 2, "must be a duration");
        let min = parse_yaml(&budget("1s")).budget;
        assert_eq!(min, Some(limits::BUDGET_MIN));
        let max = parse_yaml(&budget("30days")).budget;
        assert_eq!(max, Some(limits::BUDGET_MAX));
    }

    #[test]
    fn gate_steps_refuse_every_runnable_field() {
        assert_error(
            &gate_step("    gate: {}\n    run: [x]\n"),
            "steps[1].run",
            8,
            "a gate step has no command (remove run or gate)",
        );
        for (line, expected) in [
            (
                "executor: local",
                "steps[1].executor: a gate step has no executor (remove executor or gate)",
            ),
            (
                "timeout: 1h",
                "steps[1].timeout: a gate step has no timeout; bound its wait with gate.expires (remove timeout or gate)",
            ),
            (
                "retry: {on: step, max: 1}",
                "steps[1].retry: a gate step is never retried (remove retry or gate)",
            ),
            (
                "env: {A: b}",
                "steps[1].env: a gate step runs nothing (remove env or gate)",
            ),
            (
                "workdir: /tmp",
                "steps[1].workdir: a gate step runs nothing (remove workdir or gate)",
            ),
            (
                "image: alpine",
                "steps[1].image: a gate step runs nothing (remove image or gate)",
            ),
            (
                "command: [x]",
                "steps[1].command: a gate step has no command (remove command or gate)",
            ),
            (
                "args: [x]",
                "steps[1].args: a gate step has no command (remove args or gate)",
            ),
            (
                "resources: {}",
                "steps[1].resources: a gate step runs nothing (remove resources or gate)",
            ),
            (
                "service_account: ci",
                "steps[1].service_account: a gate step runs nothing (remove service_account or gate)",
            ),
            (
                "node_selector: {}",
                "steps[1].node_selector: a gate step runs nothing (remove node_selector or gate)",
            ),
        ] {
            let error = single_error(&gate_step(&format!("    gate: {{}}\n    {line}\n")));
            assert_eq!(error.line, Some(8), "{error}");
            assert_eq!(format!("{}: {}", error.field, error.message), expected);
        }
    }

    #[test]
    fn gate_steps_report_every_conflict_at_once() {
        let source = gate_step(
            "    executor: kubernetes\n    run: [x]\n    timeout: 1h\n    gate: {expires: 1h}\n",
        );
        let errors = yaml_errors(&source);
        let found: Vec<(&str, Option<u64>)> =
            errors.iter().map(|e| (e.field.as_str(), e.line)).collect();
        assert_eq!(
            found,
            [
                ("steps[1].executor", Some(7)),
                ("steps[1].run", Some(8)),
                ("steps[1].timeout", Some(9)),
            ]
        );
    }

    #[test]
    fn gate_waits_are_checked() {
        assert_error(
            &gate_step("    gate: {auto_release: 1h, expires: 1h}\n"),
            "steps[1].gate.auto_release",
            7,
            "must be shorter than expires (1h)",
        );
        assert_error(
            &gate_step("    gate:\n      expires: 10m\n      auto_release: 2h\n"),
            "steps[1].gate.auto_release",
            9,
            "must be shorter than expires (10m)",
        );
        assert_error(
            &gate_step("    gate: {expires: 500ms}\n"),
            "steps[1].gate.expires",
            7,
            "must be ≥ 1s",
        );
        assert_error(
            &gate_step("    gate: {auto_release: 366days}\n"),
            "steps[1].gate.auto_release",
            7,
            "must be ≤ 365days",
        );
        assert_error(
            &gate_step("    gate: {expires: never}\n"),
            "steps[1].gate.expires",
            7,
            "is not a duration",
        );
        let bounds = parse_yaml(&gate_step(
            "    gate: {auto_release: 1s, expires: 365days}\n",
        ));
        let gate = bounds.steps[1].action.gate().cloned().unwrap_or_default();
        assert_eq!(gate.auto_release, Some(limits::GATE_WAIT_MIN));
        assert_eq!(gate.expires, Some(limits::GATE_WAIT_MAX));
        let release_only = parse_yaml(&gate_step("    gate: {auto_release: 20s}\n"));
        let gate = release_only.steps[1]
            .action
            .gate()
            .cloned()
            .unwrap_or_default();
        assert_eq!(gate.auto_release, Some(Duration::from_secs(20)));
        assert_eq!(gate.expires, None);
    }

    #[test]
    fn gate_message_is_checked() {
        let limit = limits::GATE_MESSAGE_MAX_BYTES;
        let at_limit = gate_step(&format!("    gate: {{message: {}}}\n", "m".repeat(limit)));
        let gate = parse_yaml(&at_limit).steps[1].action.gate().cloned();
        assert_eq!(gate.and_then(|g| g.message).map(|m| m.len()), Some(limit));
        assert_error(
            &gate_step(&format!(
                "    gate: {{message: {}}}\n",
                "m".repeat(limit + 1)
            )),
            "steps[1].gate.message",
            7,
            &format!("must be at most {limit} bytes (found {})", limit + 1),
        );
        assert_error(
            &gate_step("    gate: {message: \"ring \\a bell\"}\n"),
            "steps[1].gate.message",
            7,
            "must not contain control or bidirectional characters (found U+0007)",
        );
        assert_error(
            &gate_step("    gate: {message: 3}\n"),
            "steps[1].gate.message",
            7,
            "must be a string (found an integer)",
        );
    }

    #[test]
    fn gate_shape_is_checked() {
        let error = single_error(&gate_step("    gate: {expire: 1h}\n"));
        assert_eq!(error.field, "steps[1].gate.expire");
        assert_eq!(error.line, Some(7));
        assert_eq!(
            error.message,
            "unknown field (did you mean \"expires\"?); known fields: auto_release, expires, message"
        );
        assert_error(
            &gate_step("    gate:\n"),
            "steps[1].gate",
            7,
            "must be a mapping (found null)",
        );
        assert_error(
            &gate_step("    gate: [x]\n"),
            "steps[1].gate",
            7,
            "must be a mapping (found a list)",
        );
        // The doc types refuse the unknown key too.
        let json = r#"{"name": "p", "steps": [{"name": "g", "gate": {"expire": "1h"}}]}"#;
        assert!(parse(json, Format::Json).is_err());
        assert!(serde_json::from_str::<PipelineDoc>(json).is_err());
    }

    #[test]
    fn a_gate_has_no_outputs_to_reference() {
        let source = "name: o\nsteps:\n  - name: a\n    run: [x]\n  - name: g\n    needs: [a]\n    gate: {}\n  - name: c\n    needs: [g]\n    run: [x]\n    env: {D: '${steps.g.outputs.digest}', E: '${steps.a.outputs.x}'}\n";
        let errors = yaml_errors(source);
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert_eq!(errors[0].field, "steps[2].env.D");
        assert_eq!(errors[0].message, "step \"g\" is a gate and has no outputs");
        // Also when the gate itself is invalid: it is still a gate.
        let invalid_gate = source.replace("gate: {}", "gate: {expires: 0s}");
        let fields: Vec<String> = yaml_errors(&invalid_gate)
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        assert!(
            fields.contains(&"steps[2].env.D: step \"g\" is a gate and has no outputs".to_owned()),
            "{fields:#?}"
        );
    }

    #[test]
    fn a_step_without_run_or_gate_still_needs_run() {
        assert_error(
            "name: p\nsteps:\n  - name: s\n    needs: []\n",
            "steps[0].run",
            3,
            "required field missing",
        );
    }

    #[test]
    fn budget_and_gates_are_in_the_schema() {
        let schema = doc::json_schema();
        let message = &schema["$defs"]["GateDoc"]["properties"]["message"];
        assert_eq!(message["maxLength"], limits::GATE_MESSAGE_MAX_BYTES);
        assert!(schema["properties"]["budget"]["description"].is_string());
        let step = &schema["$defs"]["StepDoc"];
        assert!(step["properties"]["gate"]["description"].is_string());
        let required = step["required"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            required,
            ["name"],
            "run stays optional: gate steps have none"
        );
    }
}
