pub struct FieldError; pub enum Format{Yaml,Json} pub struct ParseOutcome; pub fn parse(){} pub fn retry_warning(){}
