//! The catalog of tools and the JSON Schema validation of call arguments.
use std::collections::BTreeMap;
use std::sync::Arc;

use toolexec_core::ToolSpec;

use crate::Tool;

/// Why arguments were refused: the JSON pointer of the failing value, the schema rule it broke and
/// a sentence for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentError {
    /// JSON pointer into `arguments` (`""` for the object itself, `/file_path`, …).
    pub pointer: String,
    /// The JSON Schema keyword that failed (`required`, `type`, `minimum`, …).
    pub rule: String,
    pub message: String,
}

impl ArgumentError {
    /// The model-facing text.
    pub fn to_model_text(&self, tool: &str) -> String {
        let at = if self.pointer.is_empty() {
            "arguments".to_owned()
        } else {
            format!("arguments{}", self.pointer)
        };
        format!(
            "Invalid arguments for {tool}: {at}: {} (schema rule: {}). Fix the arguments to match the tool's input schema and call it again.",
            self.message, self.rule
        )
    }
}

struct Entry {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
}

/// One tool of the registry with its compiled validator: looked up once per call, then carried
/// through the call (validated, scheduled, run) without another lookup by name.
#[derive(Clone)]
pub struct Resolved(Arc<Entry>);

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Resolved")
            .field(&self.0.tool.spec().name)
            .finish()
    }
}

impl Resolved {
    pub fn tool(&self) -> &Arc<dyn Tool> {
        &self.0.tool
    }

    pub fn spec(&self) -> &ToolSpec {
        self.0.tool.spec()
    }

    /// Validates `args` against the tool's schema. Reports the first error, deepest-first order
    /// as the validator yields it.
    pub fn validate(&self, args: &serde_json::Value) -> Result<(), ArgumentError> {
        match self.0.validator.iter_errors(args).next() {
            None => Ok(()),
            Some(err) => Err(ArgumentError {
                pointer: err.instance_path().to_string(),
                rule: keyword_of(&err),
                message: shortened(err.to_string()),
            }),
        }
    }
}

/// All tools by name, with their compiled argument validators.
pub struct Registry {
    tools: BTreeMap<String, Arc<Entry>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("tool {name}: invalid input schema: {message}")]
    BadSchema { name: String, message: String },
    #[error("tool {0} registered twice")]
    Duplicate(String),
}

impl Registry {
    pub fn new(tools: Vec<Arc<dyn Tool>>) -> Result<Self, RegistryError> {
        let mut map = BTreeMap::new();
        for tool in tools {
            let spec = tool.spec();
            let validator = jsonschema::draft202012::new(&spec.input_schema).map_err(|e| {
                RegistryError::BadSchema {
                    name: spec.name.clone(),
                    message: e.to_string(),
                }
            })?;
            let name = spec.name.clone();
            if map
                .insert(name.clone(), Arc::new(Entry { tool, validator }))
                .is_some()
            {
                return Err(RegistryError::Duplicate(name));
            }
        }
        Ok(Self { tools: map })
    }

    /// Every built-in tool. Adding a tool: one file in `builtin/` and one line here.
    pub fn builtin() -> Result<Self, RegistryError> {
        Self::new(crate::builtin::all())
    }

    /// The built-ins and the operator's tools (see [`crate::operator::custom`] and [`crate::operator::openapi`]);
    /// an error names the entry and what is wrong with it. `net` is what the operator's
    /// endpoints are checked against at load.
    pub async fn with_custom(
        config: &crate::operator::custom::CustomToolsConfig,
        net: &crate::operator::LoadNet,
    ) -> Result<Self, String> {
        let builtin = crate::builtin::all();
        let mut taken: std::collections::BTreeSet<String> =
            builtin.iter().map(|t| t.spec().name.clone()).collect();
        let names: Vec<String> = taken.iter().cloned().collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut tools = builtin;
        let commands = crate::operator::custom::load(config, &names)?;
        taken.extend(commands.iter().map(|t| t.spec().name.clone()));
        tools.extend(commands);
        for api in &config.openapi {
            tools.extend(crate::operator::openapi::load(api, &mut taken, net).await?);
        }
        for server in &config.mcp {
            tools.extend(crate::operator::mcp_proxy::load(server, &mut taken, net).await?);
        }
        Self::new(tools).map_err(|e| e.to_string())
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|e| &e.tool)
    }

    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values().map(|e| e.tool.spec())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// The tool named `name` with its validator, to carry through a call.
    pub fn resolve(&self, name: &str) -> Option<Resolved> {
        self.tools.get(name).cloned().map(Resolved)
    }

    /// Validates `args` against the tool's schema ([`Resolved::validate`]). `None` if the tool
    /// is unknown.
    pub fn validate(
        &self,
        name: &str,
        args: &serde_json::Value,
    ) -> Option<Result<(), ArgumentError>> {
        Some(self.resolve(name)?.validate(args))
    }
}

/// Characters of a validation message kept at each end when it is cut.
const MESSAGE_END_CHARS: usize = 150;

/// The validator quotes the offending value whole (`"aaaa…" is longer than 4096 characters`),
/// which for a 16 MiB string would be the whole result: the middle of a long message is cut,
/// keeping the start of the value and the rule at the end.
fn shortened(message: String) -> String {
    let chars = message.chars().count();
    if chars <= 2 * MESSAGE_END_CHARS + 50 {
        return message;
    }
    let head: String = message.chars().take(MESSAGE_END_CHARS).collect();
    let tail: String = message.chars().skip(chars - MESSAGE_END_CHARS).collect();
    format!(
        "{head}… [{} characters cut] …{tail}",
        chars - 2 * MESSAGE_END_CHARS
    )
}

fn keyword_of(err: &jsonschema::ValidationError<'_>) -> String {
    // The schema path ends with the keyword that failed (`/properties/limit/minimum`).
    err.schema_path()
        .to_string()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}
