//! docs/rust.md's first example is examples/first.rs, which `cargo test` compiles:
//! the page cannot show code that does not build.

#[test]
fn the_first_example_of_the_docs_is_examples_first_rs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let page =
        std::fs::read_to_string(format!("{}/../../docs/rust.md", root)).expect("docs/rust.md");
    let start = page.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let block = &page[start..start + page[start..].find("```\n").expect("the block ends")];
    let example = std::fs::read_to_string(format!("{}/examples/first.rs", root)).expect("first.rs");
    assert_eq!(block, example, "docs/rust.md's first block and examples/first.rs differ");
}
