//! The CLI's tables: aligned columns that fit the terminal's width (long cells wrap in
//! their column instead of pushing the others out of line), plain when not a terminal.

use comfy_table::{Cell, ContentArrangement, Table};

/// A table with these column headers.
pub(super) fn new(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().map(Cell::new));
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// Prints `table` with no trailing spaces on its lines.
pub(super) fn print(table: &Table) {
    for line in table.lines() {
        println!("{}", line.trim_end());
    }
}
