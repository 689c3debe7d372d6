//! `schema/openapi.yaml` describes exactly the implemented API: the routes are read from
//! the router's source text and the response fields from the DTO structs' source text, so
//! neither can drift from the document without this test failing.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

const HTTP_METHODS: &[&str] = &[
    "get", "post", "put", "delete", "patch", "head", "options", "trace",
];

fn source(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn openapi() -> Value {
    let text = source("schema/openapi.yaml");
    serde_saphyr::from_str::<Value>(&text).expect("schema/openapi.yaml is valid YAML")
}

/// The string literal starting at `text[start]` (a `"`), unescaped only as far as paths
/// need, and the index just past its closing quote.
fn string_literal(text: &str, start: usize) -> (String, usize) {
    let bytes = text.as_bytes();
    assert_eq!(
        bytes.get(start),
        Some(&b'"'),
        "expected a string literal at {start}"
    );
    let mut value = String::new();
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                value.push(char::from(bytes[i + 1]));
                i += 2;
            }
            b'"' => return (value, i + 1),
            _ => {
                let c = text[i..].chars().next().expect("a character");
                value.push(c);
                i += c.len_utf8();
            }
        }
    }
    panic!("unterminated string literal at {start}");
}

/// The index just past the `)` matching the `(` at `text[open]`, skipping string literals.
fn past_matching_paren(text: &str, open: usize) -> usize {
    let bytes = text.as_bytes();
    assert_eq!(bytes[open], b'(');
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i = string_literal(text, i).1;
                continue;
            }
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!("unbalanced parentheses from {open}");
}

fn skip_whitespace(text: &str, mut i: usize) -> usize {
    while text.as_bytes().get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

fn identifier(text: &str, start: usize) -> (&str, usize) {
    let end = text[start..]
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(text.len(), |n| start + n);
    (&text[start..end], end)
}

/// The span `let NAME = … ;` (up to the first `;` outside parentheses and strings).
fn let_statement_span(text: &str, name: &str) -> (usize, usize) {
    let needle = format!("let {name} =");
    let start = text
        .find(&needle)
        .unwrap_or_else(|| panic!("no `{needle}` in src/api/mod.rs"));
    let mut i = start;
    while i < text.len() {
        match text.as_bytes()[i] {
            b'"' => i = string_literal(text, i).1,
            b'(' => i = past_matching_paren(text, i),
            b';' => return (start, i),
            _ => i += 1,
        }
    }
    panic!("`{needle}` has no end");
}

/// The span of `fn NAME(…) … { … }` (to its closing brace).
fn fn_body_span(text: &str, name: &str) -> (usize, usize) {
    let needle = format!("fn {name}(");
    let start = text
        .find(&needle)
        .unwrap_or_else(|| panic!("no `{needle}` in src/api/mod.rs"));
    let open = start + text[start..].find('{').expect("a function body");
    let mut depth = 0;
    let mut i = open;
    while i < text.len() {
        match text.as_bytes()[i] {
            b'"' => {
                i = string_literal(text, i).1;
                continue;
            }
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return (start, i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!("`{needle}` has no end");
}

/// `.nest("PREFIX", router_variable)` and `.nest("PREFIX", router_fn())` calls: (prefix,
/// span of that variable's `let`, or of that function's body).
fn nest_prefixes(text: &str) -> Vec<(String, (usize, usize))> {
    let mut nests = Vec::new();
    for (at, _) in text.match_indices(".nest(") {
        let open = at + ".nest".len();
        let (prefix, after) = string_literal(text, skip_whitespace(text, open + 1));
        let after = skip_whitespace(text, after);
        assert_eq!(&text[after..after + 1], ",", "`.nest(` with one argument");
        let (name, end) = identifier(text, skip_whitespace(text, after + 1));
        let span = if text[end..].starts_with('(') {
            fn_body_span(text, name)
        } else {
            let_statement_span(text, name)
        };
        nests.push((prefix, span));
    }
    nests
}

/// Every (METHOD, path) the router in `src/api/mod.rs` registers, parsed from
/// `.route("PATH", METHOD(handler).METHOD2(handler2))`, with `.nest` prefixes applied.
fn registered_routes() -> BTreeSet<(String, String)> {
    let text = source("src/api/mod.rs");
    let nests = nest_prefixes(&text);
    let mut routes = BTreeSet::new();
    for (at, _) in text.match_indices(".route(") {
        let open = at + ".route".len();
        let (path, after) = string_literal(&text, skip_whitespace(&text, open + 1));
        let mut i = skip_whitespace(&text, after);
        assert_eq!(
            &text[i..i + 1],
            ",",
            "`.route({path:?}` without a method router"
        );
        i = skip_whitespace(&text, i + 1);
        let prefix = nests
            .iter()
            .find(|(_, (start, end))| (*start..*end).contains(&at))
            .map_or("", |(prefix, _)| prefix.as_str());
        let mut methods = 0;
        loop {
            let (method, after_name) = identifier(&text, i);
            assert!(
                HTTP_METHODS.contains(&method),
                "route {path:?}: `{method}` is not an axum method router"
            );
            let open = skip_whitespace(&text, after_name);
            i = past_matching_paren(&text, open);
            routes.insert((method.to_uppercase(), format!("{prefix}{path}")));
            methods += 1;
            let next = skip_whitespace(&text, i);
            if text.as_bytes()[next] != b'.' {
                break;
            }
            i = skip_whitespace(&text, next + 1);
        }
        assert!(methods > 0, "route {path:?} has no method");
    }
    assert!(!routes.is_empty(), "no routes found in src/api/mod.rs");
    routes
}

fn documented_routes(spec: &Value) -> BTreeSet<(String, String)> {
    let paths = spec["paths"].as_object().expect("`paths` is a mapping");
    let mut routes = BTreeSet::new();
    for (path, item) in paths {
        let item = item.as_object().expect("a path item is a mapping");
        for key in item.keys() {
            if HTTP_METHODS.contains(&key.as_str()) {
                routes.insert((key.to_uppercase(), path.clone()));
            }
        }
    }
    routes
}

/// The field names of `pub struct NAME { … }` in `relative`, in order.
fn struct_fields(relative: &str, name: &str) -> Vec<String> {
    let text = source(relative);
    let header = format!("pub struct {name} {{");
    let start = text
        .find(&header)
        .unwrap_or_else(|| panic!("no `{header}` in {relative}"))
        + header.len();
    let end = start
        + text[start..]
            .find("\n}")
            .expect("the struct's closing brace");
    let body = &text[start..end];
    assert!(
        !body.contains("#[serde"),
        "{name} has serde attributes: teach this test about them"
    );
    body.lines()
        .map(str::trim)
        .filter_map(|line| line.strip_prefix("pub "))
        .filter_map(|line| line.split_once(':'))
        .map(|(field, _)| field.trim().to_string())
        .collect()
}

fn sorted(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort();
    names
}

fn schema_required(spec: &Value, schema: &str) -> Vec<String> {
    let required = spec["components"]["schemas"][schema]["required"]
        .as_array()
        .unwrap_or_else(|| panic!("components.schemas.{schema}.required is a list"));
    sorted(
        required
            .iter()
            .map(|v| v.as_str().expect("a name").to_string()),
    )
}

fn schema_properties(spec: &Value, schema: &str) -> Vec<String> {
    let properties = spec["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("components.schemas.{schema}.properties is a mapping"));
    sorted(properties.keys().cloned())
}

#[test]
fn openapi_is_version_3_1() {
    let spec = openapi();
    let version = spec["openapi"].as_str().expect("`openapi` is a string");
    assert!(version.starts_with("3.1."), "openapi: {version}");
}

#[test]
fn documented_routes_equal_the_registered_routes() {
    let registered = registered_routes();
    let documented = documented_routes(&openapi());
    let missing: Vec<_> = registered.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&registered).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "schema/openapi.yaml is out of step with src/api/mod.rs\n  \
         registered but not documented: {missing:?}\n  documented but not registered: {extra:?}"
    );
}

#[test]
fn route_parser_sees_the_known_routes() {
    // Guards the source parser itself: if it silently found nothing under `/v1`, the
    // equality test above would compare two wrong sets.
    let registered = registered_routes();
    for (method, path) in [
        ("GET", "/healthz"),
        ("POST", "/v1/runs"),
        ("GET", "/v1/runs"),
        ("GET", "/v1/runs/{id}/steps/{step}/logs"),
    ] {
        assert!(
            registered.contains(&(method.to_string(), path.to_string())),
            "{method} {path} not found in {registered:?}"
        );
    }
}

#[test]
fn run_detail_required_fields_equal_the_struct_fields() {
    let spec = openapi();
    let fields = sorted(struct_fields("src/api/dto.rs", "RunDetail"));
    assert!(fields.contains(&"failure_classification".to_string()));
    assert_eq!(
        schema_required(&spec, "RunDetail"),
        fields,
        "RunDetail.required"
    );
    assert_eq!(
        schema_properties(&spec, "RunDetail"),
        fields,
        "RunDetail.properties"
    );
}

#[test]
fn nested_response_schemas_equal_their_structs() {
    let spec = openapi();
    for (schema, structure) in [
        ("RunSummary", "RunSummary"),
        ("Step", "StepDetail"),
        ("Attempt", "AttemptDto"),
        ("FailureClassification", "ClassificationDto"),
        ("AutoRetry", "AutoRetryDto"),
    ] {
        let fields = sorted(struct_fields("src/api/dto.rs", structure));
        assert_eq!(schema_required(&spec, schema), fields, "{schema}.required");
        assert_eq!(
            schema_properties(&spec, schema),
            fields,
            "{schema}.properties"
        );
    }
}

/// Every `$ref` names a component that exists.
#[test]
fn every_reference_resolves() {
    fn walk(value: &Value, root: &Value, dangling: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    let found = target
                        .strip_prefix("#/")
                        .map(|path| path.split('/').try_fold(root, |node, key| node.get(key)))
                        .is_some_and(|node| node.is_some());
                    if !found {
                        dangling.push(target.clone());
                    }
                }
                map.values().for_each(|v| walk(v, root, dangling));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, root, dangling)),
            _ => {}
        }
    }
    let document = openapi();
    let mut dangling = Vec::new();
    walk(&document, &document, &mut dangling);
    assert!(dangling.is_empty(), "unresolved $ref: {dangling:?}");
}
