//! The committed JSON Schema is generated from the Rust document types: they cannot drift.

#[test]
fn committed_schema_matches_the_rust_types() {
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../../schema/pipeline.schema.json"))
            .expect("schema is JSON");
    let generated = scarab::pipeline::doc::json_schema();
    assert_eq!(
        committed, generated,
        "schema/pipeline.schema.json is stale: regenerate it with `scarab schema > schema/pipeline.schema.json`"
    );
}

#[test]
fn every_example_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let parsed = scarab::pipeline::parse(&text, scarab::pipeline::Format::Yaml);
        assert!(parsed.is_ok(), "{}: {:?}", path.display(), parsed.err());
        count += 1;
    }
    assert!(count >= 4, "examples/ holds the four documented pipelines");
}
