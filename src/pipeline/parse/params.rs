//! Pipeline parameters: `params: {NAME: {default, pattern, description}}` declared in the
//! document, values given at submit, and `${params.NAME}` substituted textually into
//! argv elements, env values, images and the concurrency group — never through a shell:
//! a value is one string where the reference stood, whatever it holds. The substitution
//! happens on the located tree before the rest of the validation, so a substituted value
//! meets every bound of its field, and an error names the field and its line.

use std::collections::BTreeMap;

use regex::{Regex, RegexBuilder};

use super::{Errors, Field, Node, Value, as_fields, as_map, as_str};
use crate::limits;

const PARAM_FIELDS: &[&str] = &["default", "pattern", "description"];
const PREFIX: &str = "${params.";

/// A declared parameter.
pub(super) struct Declared {
    name: String,
    default: Option<String>,
    /// The pattern as written, and compiled to match a whole value.
    pattern: Option<(String, Regex)>,
}

/// What `${params.NAME}` becomes.
#[derive(Clone, Copy)]
pub enum Binding<'a> {
    /// The document on its own (`scarab validate`, `scarab schema` checks): each
    /// parameter's default, or for one without a default its name, so the rest of the
    /// document can be checked.
    Check,
    /// The values given at submit, each checked against its declaration.
    Values(&'a [(String, String)]),
    /// No substitution: a run stored before parameters existed, whose text may hold a
    /// literal `${params.…}` that was never a reference.
    Off,
}

/// `params` of the document: names, defaults and patterns, each checked.
pub(super) fn declarations(root: &Field, errors: &mut Errors) -> Vec<Declared> {
    let Value::Map(entries) = &root.node.value else {
        return Vec::new();
    };
    let Some(entry) = entries.iter().find(|e| e.key.name == "params") else {
        return Vec::new();
    };
    let field = root.key("params", &entry.value);
    let Some(entries) = as_map(&field, errors) else {
        return Vec::new();
    };
    if entries.len() > limits::PARAMS_MAX {
        errors.at(
            &field,
            format!(
                "at most {} parameters (found {})",
                limits::PARAMS_MAX,
                entries.len()
            ),
        );
        return Vec::new();
    }
    let mut declared = Vec::new();
    for entry in entries {
        let param = field.key(&entry.key.name, &entry.value);
        if let Err(problem) = check_name(&entry.key.name) {
            errors.at(&param, problem);
            continue;
        }
        if let Some(one) = declaration(&entry.key.name, &param, errors) {
            declared.push(one);
        }
    }
    declared
}

fn declaration(name: &str, param: &Field, errors: &mut Errors) -> Option<Declared> {
    // `NAME: {}` and `NAME:` (null) both declare a required parameter.
    if let Value::Null = param.node.value {
        return Some(Declared {
            name: name.to_owned(),
            default: None,
            pattern: None,
        });
    }
    let fields = as_fields(param, PARAM_FIELDS, errors)?;
    let pattern = match fields.get("pattern") {
        None => None,
        Some(field) => {
            let text = as_str(&field, errors)?;
            match compile(text) {
                Ok(regex) => Some((text.to_owned(), regex)),
                Err(problem) => {
                    errors.at(&field, problem);
                    return None;
                }
            }
        }
    };
    if let Some(field) = fields.get("description") {
        let text = as_str(&field, errors)?;
        if text.len() > limits::PARAM_DESCRIPTION_MAX_BYTES {
            errors.at(
                &field,
                format!("at most {} bytes", limits::PARAM_DESCRIPTION_MAX_BYTES),
            );
            return None;
        }
    }
    let default = match fields.get("default") {
        None => None,
        Some(field) => {
            let text = as_str(&field, errors)?;
            if let Err(problem) = check_value(text, pattern.as_ref()) {
                errors.at(&field, problem);
                return None;
            }
            Some(text.to_owned())
        }
    };
    Some(Declared {
        name: name.to_owned(),
        default,
        pattern,
    })
}

/// A parameter name: a letter or `_`, then letters, digits and `_`.
fn check_name(name: &str) -> Result<(), String> {
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= limits::PARAM_NAME_MAX_BYTES;
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a parameter name (a letter or _, then letters, digits and _, at most {} bytes)",
            limits::PARAM_NAME_MAX_BYTES
        ))
    }
}

/// The pattern, anchored to match a whole value, with bounded size.
fn compile(pattern: &str) -> Result<Regex, String> {
    if pattern.len() > limits::PARAM_PATTERN_MAX_BYTES {
        return Err(format!("at most {} bytes", limits::PARAM_PATTERN_MAX_BYTES));
    }
    RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(limits::PARAM_PATTERN_COMPILED_MAX_BYTES)
        .build()
        .map_err(|e| format!("not a valid pattern: {e}"))
}

/// A value: bounded, one line of printable text, and matching the pattern if any.
fn check_value(value: &str, pattern: Option<&(String, Regex)>) -> Result<(), String> {
    if value.len() > limits::PARAM_VALUE_MAX_BYTES {
        return Err(format!(
            "at most {} bytes (found {})",
            limits::PARAM_VALUE_MAX_BYTES,
            value.len()
        ));
    }
    crate::text::check(value, false)?;
    if let Some((text, regex)) = pattern
        && !regex.is_match(value)
    {
        return Err(format!("{value:?} does not match the pattern {text:?}"));
    }
    Ok(())
}

/// Every parameter's value: given (checked), else its default. In `Values` mode a value
/// for an undeclared name and a missing value without a default are errors naming
/// `params.NAME`.
pub(super) fn bind(
    declared: &[Declared],
    binding: Binding,
    errors: &mut Errors,
) -> BTreeMap<String, String> {
    let mut values = BTreeMap::new();
    let given = match binding {
        Binding::Check | Binding::Off => &[][..],
        Binding::Values(given) => given,
    };
    for (name, value) in given {
        let path = format!("params.{name}");
        let Some(declaration) = declared.iter().find(|d| d.name == *name) else {
            let known: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
            errors.push(
                path,
                None,
                format!(
                    "the pipeline declares no such parameter (declared: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            );
            continue;
        };
        if values.contains_key(name) {
            errors.push(path, None, "given twice");
            continue;
        }
        match check_value(value, declaration.pattern.as_ref()) {
            Ok(()) => {
                values.insert(name.clone(), value.clone());
            }
            Err(problem) => errors.push(path, None, problem),
        }
    }
    for declaration in declared {
        if values.contains_key(&declaration.name) {
            continue;
        }
        match (&declaration.default, binding) {
            (Some(default), _) => {
                values.insert(declaration.name.clone(), default.clone());
            }
            (None, Binding::Check | Binding::Off) => {
                values.insert(declaration.name.clone(), declaration.name.clone());
            }
            (None, Binding::Values(_)) => errors.push(
                format!("params.{}", declaration.name),
                None,
                "required: the parameter has no default and no value was given",
            ),
        }
    }
    values
}

/// Replaces `${params.NAME}` in the fields that take parameters: each step's `run`,
/// `command` and `args` items, `env` values and `image`, the pipeline's
/// `kubernetes.image` and `concurrency.group`. A reference to an undeclared parameter is
/// an error at its field.
pub(super) fn substitute(root: &mut Node, values: &BTreeMap<String, String>, errors: &mut Errors) {
    let Value::Map(entries) = &mut root.value else {
        return;
    };
    for entry in entries.iter_mut() {
        let path = entry.key.name.clone();
        match path.as_str() {
            "concurrency" => in_map_key(&mut entry.value, &path, "group", values, errors),
            "kubernetes" => in_map_key(&mut entry.value, &path, "image", values, errors),
            "steps" => {
                if let Value::Seq(steps) = &mut entry.value.value {
                    for (i, step) in steps.iter_mut().enumerate() {
                        in_step(step, &format!("steps[{i}]"), values, errors);
                    }
                }
            }
            _ => {}
        }
    }
}

fn in_step(step: &mut Node, path: &str, values: &BTreeMap<String, String>, errors: &mut Errors) {
    let Value::Map(entries) = &mut step.value else {
        return;
    };
    for entry in entries.iter_mut() {
        let path = format!("{path}.{}", entry.key.name);
        match entry.key.name.as_str() {
            "run" | "command" | "args" => {
                if let Value::Seq(items) = &mut entry.value.value {
                    for (i, item) in items.iter_mut().enumerate() {
                        in_string(item, &format!("{path}[{i}]"), values, errors);
                    }
                }
            }
            "env" => {
                if let Value::Map(vars) = &mut entry.value.value {
                    for var in vars.iter_mut() {
                        let path = format!("{path}.{}", var.key.name);
                        in_string(&mut var.value, &path, values, errors);
                    }
                }
            }
            "image" => in_string(&mut entry.value, &path, values, errors),
            _ => {}
        }
    }
}

fn in_map_key(
    node: &mut Node,
    path: &str,
    key: &str,
    values: &BTreeMap<String, String>,
    errors: &mut Errors,
) {
    if let Value::Map(entries) = &mut node.value {
        for entry in entries.iter_mut().filter(|e| e.key.name == key) {
            in_string(&mut entry.value, &format!("{path}.{key}"), values, errors);
        }
    }
}

/// One string node: every `${params.NAME}` replaced, left to right, in one pass (a value
/// that itself reads `${params.…}` stays as it is).
fn in_string(node: &mut Node, path: &str, values: &BTreeMap<String, String>, errors: &mut Errors) {
    let Value::Str(text) = &node.value else {
        return;
    };
    if !text.contains(PREFIX) {
        return;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(start) = rest.find(PREFIX) {
        out.push_str(&rest[..start]);
        let after = &rest[start + PREFIX.len()..];
        let Some(end) = after.find('}') else {
            errors.push(
                path.to_owned(),
                node.line,
                "an unclosed ${params. reference",
            );
            return;
        };
        let name = &after[..end];
        match values.get(name) {
            Some(value) => out.push_str(value),
            None => {
                errors.push(
                    path.to_owned(),
                    node.line,
                    format!("${{params.{name}}}: the pipeline declares no such parameter"),
                );
                return;
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    node.value = Value::Str(out);
}

#[cfg(test)]
mod tests {
    use super::super::{FieldError, Format, parse_with};
    use super::Binding;
    use crate::pipeline::{Pipeline, StepAction};

    const DOC: &str = "name: p
params:
  env: {default: staging, pattern: 'staging|prod', description: where}
  tag: {pattern: '[0-9]+\\.[0-9]+'}
  msg: {default: 'hello'}
concurrency: {group: 'deploy-${params.env}'}
steps:
  - name: build
    run: [echo, '${params.msg}', 'v${params.tag}-${params.env}']
    env: {TARGET: '${params.env}', LITERAL: 'no $params here'}
  - name: push
    executor: kubernetes
    image: 'registry.example/app:${params.tag}'
";

    fn bound(given: &[(&str, &str)]) -> Result<Pipeline, Vec<FieldError>> {
        let given: Vec<(String, String)> = given
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        parse_with(DOC, Format::Yaml, Binding::Values(&given)).map(|o| o.pipeline)
    }

    fn argv(pipeline: &Pipeline, step: usize) -> Vec<String> {
        match &pipeline.steps[step].action {
            StepAction::Local(command) => command.argv.clone(),
            other => panic!("not local: {other:?}"),
        }
    }

    #[test]
    fn values_and_defaults_are_substituted_as_text_and_recorded() {
        let pipeline = bound(&[("tag", "1.2"), ("msg", "a; rm -rf / $(x)")]).expect("valid");
        assert_eq!(
            argv(&pipeline, 0),
            vec!["echo", "a; rm -rf / $(x)", "v1.2-staging"],
            "one argv element per item, whatever the value holds"
        );
        let StepAction::Local(command) = &pipeline.steps[0].action else {
            unreachable!()
        };
        assert!(command.env.contains(&("TARGET".into(), "staging".into())));
        assert!(
            command
                .env
                .contains(&("LITERAL".into(), "no $params here".into()))
        );
        let StepAction::Kubernetes(pod) = &pipeline.steps[1].action else {
            panic!("a pod")
        };
        assert_eq!(pod.image, "registry.example/app:1.2");
        assert_eq!(
            pipeline.concurrency.as_ref().map(|c| c.group.as_str()),
            Some("deploy-staging")
        );
        assert_eq!(
            pipeline.params,
            vec![
                ("env".to_string(), "staging".to_string()),
                ("msg".into(), "a; rm -rf / $(x)".into()),
                ("tag".into(), "1.2".into()),
            ]
        );
    }

    #[test]
    fn bad_values_are_errors_naming_the_parameter() {
        type Case = (
            &'static [(&'static str, &'static str)],
            &'static str,
            &'static str,
        );
        let cases: &[Case] = &[
            (&[], "params.tag", "required"),
            (&[("tag", "1.x")], "params.tag", "does not match"),
            (
                &[("tag", "1.2"), ("nope", "1")],
                "params.nope",
                "no such parameter",
            ),
            (
                &[("tag", "1.2"), ("env", "qa")],
                "params.env",
                "does not match",
            ),
            (&[("tag", "1.2"), ("msg", "two\nlines")], "params.msg", ""),
            (&[("tag", "1.2"), ("tag", "1.3")], "params.tag", "twice"),
        ];
        for (given, field, message) in cases {
            let errors = bound(given).expect_err(field);
            assert!(
                errors
                    .iter()
                    .any(|e| e.field == *field && e.message.contains(message) && e.line.is_none()),
                "{given:?}: {errors:#?}"
            );
        }
        let long = "1".repeat(crate::limits::PARAM_VALUE_MAX_BYTES + 1);
        let errors = bound(&[("tag", &long)]).expect_err("long");
        assert!(
            errors.iter().any(|e| e.field == "params.tag"),
            "{errors:#?}"
        );
    }

    #[test]
    fn declarations_and_references_are_checked_in_the_document() {
        let check = |doc: &str| parse_with(doc, Format::Yaml, Binding::Check);
        let errors = check("name: p\nsteps:\n  - name: s\n    run: [echo, '${params.who}']\n")
            .expect_err("undeclared");
        assert_eq!(errors[0].field, "steps[0].run[1]");
        assert_eq!(errors[0].line, Some(4));
        assert!(errors[0].message.contains("${params.who}"), "{errors:#?}");
        for (doc, field) in [
            ("params: {x: {pattern: '('}}", "params.x.pattern"),
            (
                "params: {x: {pattern: '[a-z]+', default: 'A'}}",
                "params.x.default",
            ),
            ("params: {9x: {}}", "params.9x"),
            ("params: {x: {colour: red}}", "params.x.colour"),
            ("params: [x]", "params"),
        ] {
            let doc = format!("name: p\n{doc}\nsteps:\n  - name: s\n    run: [echo]\n");
            let errors = check(&doc).expect_err(field);
            assert!(
                errors.iter().any(|e| e.field == field),
                "{doc}: {errors:#?}"
            );
        }
        // On its own a document with a required parameter is valid.
        let outcome = check(DOC).expect("valid on its own");
        assert!(outcome.pipeline.params.is_empty());
        // A run stored before parameters existed keeps its text as it was.
        let old = "name: p\nsteps:\n  - name: s\n    run: [echo, '${params.who}']\n";
        let pipeline = parse_with(old, Format::Yaml, Binding::Off)
            .expect("literal")
            .pipeline;
        assert_eq!(argv(&pipeline, 0), vec!["echo", "${params.who}"]);
        // A substituted value meets its field's bounds.
        let big = format!(
            "name: p\nparams: {{v: {{}}}}\nsteps:\n  - name: s\n    run: [echo, '{}']\n",
            "${params.v}".repeat(5)
        );
        let value = "x".repeat(crate::limits::PARAM_VALUE_MAX_BYTES);
        let given = vec![("v".to_string(), value)];
        let errors = parse_with(&big, Format::Yaml, Binding::Values(&given)).expect_err("too long");
        assert!(
            errors.iter().any(|e| e.field == "steps[0].run[1]"),
            "{errors:#?}"
        );
    }
}
