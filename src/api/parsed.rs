//! The pipeline documents the API parsed last, kept so that a client submitting the
//! same document again and again (the common case: a producer with one pipeline) does
//! not have it parsed and validated each time.
//!
//! Parsing is a pure function of the document's text, its format and the parameter
//! values, so an entry is found by exactly those and its outcome is the one a fresh
//! parse would give. Only valid documents are kept, at most
//! `limits::PARSED_PIPELINES_MAX` of them, none longer than
//! `limits::PARSED_PIPELINE_TEXT_MAX_BYTES` nor parsed into a pipeline larger than
//! `limits::PARSED_PIPELINE_MAX_BYTES`; the least recently used goes first. What
//! depends on the service's settings (`Settings::check_pipeline`) is checked on every
//! request, outside this cache.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::limits;
use crate::pipeline::{self, FieldError, Format, Pipeline};

/// A valid document, as parsed for one set of parameter values.
#[derive(Clone, Debug)]
pub struct Accepted {
    pub pipeline: Arc<Pipeline>,
    pub warnings: Arc<[String]>,
}

struct Entry {
    format: Format,
    text: Box<str>,
    params: Box<[(String, String)]>,
    accepted: Accepted,
}

impl Entry {
    fn is(&self, text: &str, format: Format, params: &[(String, String)]) -> bool {
        self.format == format && *self.text == *text && *self.params == *params
    }
}

#[derive(Default)]
pub struct Parsed {
    /// Most recently used first.
    entries: Mutex<VecDeque<Entry>>,
}

impl Parsed {
    /// The document parsed and validated with these parameter values: from the cache
    /// when it holds them, else parsed now (and kept, if valid and small enough).
    pub fn parse(
        &self,
        text: &str,
        format: Format,
        params: &[(String, String)],
    ) -> Result<Accepted, Vec<FieldError>> {
        if let Some(accepted) = self.find(text, format, params) {
            return Ok(accepted);
        }
        let outcome = pipeline::parse_with(text, format, pipeline::Binding::Values(params))?;
        let accepted = Accepted {
            pipeline: Arc::new(outcome.pipeline),
            warnings: outcome.warnings.into(),
        };
        if text.len() <= limits::PARSED_PIPELINE_TEXT_MAX_BYTES
            && footprint(&accepted.pipeline) <= limits::PARSED_PIPELINE_MAX_BYTES
        {
            self.keep(Entry {
                format,
                text: text.into(),
                params: params.into(),
                accepted: accepted.clone(),
            });
        }
        Ok(accepted)
    }

    fn find(&self, text: &str, format: Format, params: &[(String, String)]) -> Option<Accepted> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let at = entries
            .iter()
            .position(|entry| entry.is(text, format, params))?;
        let entry = entries.remove(at)?;
        let accepted = entry.accepted.clone();
        entries.push_front(entry);
        Some(accepted)
    }

    fn keep(&self, entry: Entry) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        // Two requests may have parsed the same document at once: keep one entry.
        entries.retain(|kept| !kept.is(&entry.text, entry.format, &entry.params));
        entries.push_front(entry);
        entries.truncate(limits::PARSED_PIPELINES_MAX);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

/// What keeping a pipeline costs, measured as the length of its `Debug` rendering,
/// which spells out every string it holds (counted, not allocated). A short document
/// can stand for a large pipeline: YAML aliases repeat what they name.
fn footprint(pipeline: &Pipeline) -> usize {
    struct Count(usize);
    impl std::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = std::fmt::Write::write_fmt(&mut count, format_args!("{pipeline:?}"));
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "name: p\nparams:\n  who: {default: w}\nsteps:\n  - name: t\n    run: [echo, '${params.who}']\n";

    fn params(who: &str) -> Vec<(String, String)> {
        vec![("who".to_string(), who.to_string())]
    }

    #[test]
    fn the_same_document_and_values_are_parsed_once() {
        let parsed = Parsed::default();
        let first = parsed
            .parse(DOC, Format::Yaml, &params("a"))
            .expect("valid");
        let fresh =
            pipeline::parse_with(DOC, Format::Yaml, pipeline::Binding::Values(&params("a")))
                .expect("valid");
        assert_eq!(*first.pipeline, fresh.pipeline, "what a fresh parse gives");
        assert_eq!(&*first.warnings, fresh.warnings.as_slice());
        let again = parsed
            .parse(DOC, Format::Yaml, &params("a"))
            .expect("valid");
        assert!(
            Arc::ptr_eq(&first.pipeline, &again.pipeline),
            "from the cache"
        );

        let other = parsed
            .parse(DOC, Format::Yaml, &params("b"))
            .expect("valid");
        assert!(
            !Arc::ptr_eq(&first.pipeline, &other.pipeline),
            "other values"
        );
        assert_eq!(other.pipeline.params, params("b"));
        let edited = format!("{DOC}# edited\n");
        let third = parsed
            .parse(&edited, Format::Yaml, &params("a"))
            .expect("valid");
        assert!(!Arc::ptr_eq(&first.pipeline, &third.pipeline), "other text");
        assert_eq!(parsed.len(), 3);
    }

    #[test]
    fn invalid_and_large_documents_are_not_kept() {
        let parsed = Parsed::default();
        let errors = parsed
            .parse("name: p\nsteps: []\n", Format::Yaml, &[])
            .expect_err("no steps");
        assert!(!errors.is_empty());
        let errors = parsed
            .parse(DOC, Format::Yaml, &[("nobody".into(), "x".into())])
            .expect_err("an undeclared parameter");
        assert!(
            errors.iter().any(|e| e.field.starts_with("params.")),
            "{errors:?}"
        );
        // Short, but its aliases make a large pipeline.
        let arg = format!("'{}'", "x".repeat(200));
        let args = vec![arg; 50].join(", ");
        let mut aliased = format!("name: p\nsteps:\n  - name: s0\n    run: &a [{args}]\n");
        for i in 1..20 {
            aliased.push_str(&format!("  - name: s{i}\n    run: *a\n"));
        }
        assert!(aliased.len() <= limits::PARSED_PIPELINE_TEXT_MAX_BYTES);
        let first = parsed.parse(&aliased, Format::Yaml, &[]).expect("valid");
        assert!(footprint(&first.pipeline) > limits::PARSED_PIPELINE_MAX_BYTES);
        let again = parsed.parse(&aliased, Format::Yaml, &[]).expect("valid");
        assert!(
            !Arc::ptr_eq(&first.pipeline, &again.pipeline),
            "parsed each time"
        );
        let padding = "#".repeat(limits::PARSED_PIPELINE_TEXT_MAX_BYTES);
        let large = format!("{DOC}{padding}\n");
        let first = parsed
            .parse(&large, Format::Yaml, &params("a"))
            .expect("valid");
        let again = parsed
            .parse(&large, Format::Yaml, &params("a"))
            .expect("valid");
        assert!(
            !Arc::ptr_eq(&first.pipeline, &again.pipeline),
            "parsed each time"
        );
        assert_eq!(parsed.len(), 0);
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let parsed = Parsed::default();
        let who = |i: usize| params(&format!("v{i}"));
        let first = parsed.parse(DOC, Format::Yaml, &who(0)).expect("valid");
        let second = parsed.parse(DOC, Format::Yaml, &who(1)).expect("valid");
        for i in 2..limits::PARSED_PIPELINES_MAX {
            parsed.parse(DOC, Format::Yaml, &who(i)).expect("valid");
        }
        // Used again: the second one is now the least recently used, and goes.
        parsed.parse(DOC, Format::Yaml, &who(0)).expect("valid");
        parsed.parse(DOC, Format::Yaml, &who(100)).expect("valid");
        assert_eq!(parsed.len(), limits::PARSED_PIPELINES_MAX);
        let kept = parsed.parse(DOC, Format::Yaml, &who(0)).expect("valid");
        assert!(Arc::ptr_eq(&first.pipeline, &kept.pipeline), "kept");
        let parsed_again = parsed.parse(DOC, Format::Yaml, &who(1)).expect("valid");
        assert!(
            !Arc::ptr_eq(&second.pipeline, &parsed_again.pipeline),
            "gone"
        );
        assert_eq!(parsed.len(), limits::PARSED_PIPELINES_MAX);
    }
}
