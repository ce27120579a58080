//! Label selectors (`labelSelector=`), parsed with kube-apiserver's grammar and error texts.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::field::FieldError;
use crate::validation::{label_value, qualified_name};

/// A selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// `k=v`, `k==v`, `k in (…)`.
    In,
    /// `k!=v`, `k notin (…)`.
    NotIn,
    /// `k`.
    Exists,
    /// `!k`.
    DoesNotExist,
    /// `k>n`.
    GreaterThan,
    /// `k<n`.
    LessThan,
}

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// The operator.
    pub operator: Operator,
    /// The values (sorted).
    pub values: BTreeSet<String>,
}

impl Requirement {
    /// Whether a label value (`None`: no such label) meets the requirement.
    fn admits(&self, value: Option<&str>) -> bool {
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(have) = value.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(want) = self
                    .values
                    .iter()
                    .next()
                    .and_then(|v| v.parse::<i64>().ok())
                else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

/// A parsed label selector: every requirement must hold. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// The requirements, in the order given.
    pub requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses `labelSelector`; the error is the text kube-apiserver puts in its 400.
    pub fn parse(text: &str) -> Result<Self, String> {
        Parser::new(text).parse()
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object with these labels (`metadata.labels`, possibly absent) matches.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.matches_with(|key| labels?.get(key)?.as_str())
    }

    /// Whether an object matches, given how to read one of its labels.
    pub fn matches_with<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.admits(label(&r.key)))
    }

    /// A selector requiring exactly these `key: value` pairs (a Service's `spec.selector`).
    pub fn from_map(map: &Map<String, Value>) -> Self {
        Self::from_pairs(
            map.iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default())),
        )
    }

    /// A selector requiring exactly these `key`, `value` pairs (a typed `spec.selector`).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        LabelSelector {
            requirements: pairs
                .into_iter()
                .map(|(k, v)| Requirement {
                    key: k.to_string(),
                    operator: Operator::In,
                    values: BTreeSet::from([v.to_string()]),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    End,
    Identifier(String),
    In,
    NotIn,
    Not,
    NotEquals,
    Equals,
    DoubleEquals,
    GreaterThan,
    LessThan,
    OpenPar,
    ClosedPar,
    Comma,
}

impl Token {
    fn literal(&self) -> &str {
        match self {
            Token::End => "",
            Token::Identifier(s) => s,
            Token::In => "in",
            Token::NotIn => "notin",
            Token::Not => "!",
            Token::NotEquals => "!=",
            Token::Equals => "=",
            Token::DoubleEquals => "==",
            Token::GreaterThan => ">",
            Token::LessThan => "<",
            Token::OpenPar => "(",
            Token::ClosedPar => ")",
            Token::Comma => ",",
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if is_special(c) {
            let next = chars.get(i + 1).copied();
            let (token, width) = match (c, next) {
                ('!', Some('=')) => (Token::NotEquals, 2),
                ('=', Some('=')) => (Token::DoubleEquals, 2),
                ('!', _) => (Token::Not, 1),
                ('=', _) => (Token::Equals, 1),
                ('(', _) => (Token::OpenPar, 1),
                (')', _) => (Token::ClosedPar, 1),
                (',', _) => (Token::Comma, 1),
                ('>', _) => (Token::GreaterThan, 1),
                _ => (Token::LessThan, 1),
            };
            tokens.push(token);
            i += width;
            continue;
        }
        let start = i;
        while i < chars.len() && !chars[i].is_whitespace() && !is_special(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        tokens.push(match word.as_str() {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Identifier(word),
        });
    }
    tokens.push(Token::End);
    tokens
}

struct Parser {
    tokens: Vec<Token>,
    position: usize,
}

/// In "values" mode the keywords `in`/`notin` read as plain identifiers.
fn as_value(token: Token) -> Token {
    match token {
        Token::In | Token::NotIn => Token::Identifier(token.literal().to_string()),
        other => other,
    }
}

impl Parser {
    fn new(text: &str) -> Self {
        Parser {
            tokens: lex(text),
            position: 0,
        }
    }

    fn peek(&self) -> Token {
        as_value(
            self.tokens
                .get(self.position)
                .cloned()
                .unwrap_or(Token::End),
        )
    }

    fn next_raw(&mut self) -> Token {
        let token = self
            .tokens
            .get(self.position)
            .cloned()
            .unwrap_or(Token::End);
        self.position = (self.position + 1).min(self.tokens.len());
        token
    }

    fn next(&mut self) -> Token {
        as_value(self.next_raw())
    }

    fn parse(mut self) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        loop {
            match self.peek() {
                Token::Identifier(_) | Token::Not => {
                    let requirement = self
                        .requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(requirement);
                    match self.next() {
                        Token::End => break,
                        Token::Comma => match self.peek() {
                            Token::Identifier(_) | Token::Not => {}
                            other => {
                                return Err(format!(
                                    "found '{}', expected: identifier after ','",
                                    other.literal()
                                ));
                            }
                        },
                        other => {
                            return Err(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                other.literal()
                            ));
                        }
                    }
                }
                Token::End => break,
                other => {
                    return Err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        other.literal()
                    ));
                }
            }
        }
        Ok(LabelSelector { requirements })
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let mut operator = None;
        let mut token = self.next();
        if token == Token::Not {
            operator = Some(Operator::DoesNotExist);
            token = self.next();
        }
        let Token::Identifier(key) = token else {
            return Err(format!("found '{}', expected: identifier", token.literal()));
        };
        if let Some(message) = qualified_name(&key).into_iter().next() {
            return Err(format!(
                "<nil>: {}",
                FieldError::invalid("", &json!(key), message).body()
            ));
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            let operator = operator.unwrap_or(Operator::Exists);
            return Ok(Requirement {
                key,
                operator,
                values: BTreeSet::new(),
            });
        }
        if operator.is_some() {
            // `!key` must be followed by the end or a comma.
            let found = self.peek();
            return Err(format!(
                "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                found.literal()
            ));
        }
        let operator_token = self.next_raw();
        let (operator, values) = match operator_token {
            Token::In | Token::NotIn => {
                let values = self.set_values()?;
                let op = if operator_token == Token::In {
                    Operator::In
                } else {
                    Operator::NotIn
                };
                (op, values)
            }
            Token::Equals | Token::DoubleEquals => (Operator::In, self.exact_value()?),
            Token::NotEquals => (Operator::NotIn, self.exact_value()?),
            Token::GreaterThan => (Operator::GreaterThan, self.exact_value()?),
            Token::LessThan => (Operator::LessThan, self.exact_value()?),
            other => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    other.literal()
                ));
            }
        };
        for (i, value) in values.iter().enumerate() {
            if let Some(message) = label_value(value).into_iter().next() {
                return Err(format!(
                    "values[{i}][{key}]: {}",
                    FieldError::invalid("", &json!(value), message).body()
                ));
            }
        }
        if matches!(operator, Operator::GreaterThan | Operator::LessThan) {
            let value = values.iter().next().cloned().unwrap_or_default();
            if value.parse::<i64>().is_err() {
                return Err(format!(
                    "values[0]: Invalid value: {}: for 'Gt', 'Lt' operators, the value must be an integer",
                    capstan_gostd::quote(&value)
                ));
            }
        }
        Ok(Requirement {
            key,
            operator,
            values,
        })
    }

    fn exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        match self.next() {
            Token::Identifier(value) => Ok(BTreeSet::from([value])),
            other => Err(format!("found '{}', expected: identifier", other.literal())),
        }
    }

    fn set_values(&mut self) -> Result<BTreeSet<String>, String> {
        let open = self.next();
        if open != Token::OpenPar {
            return Err(format!("found '{}' expected: '('", open.literal()));
        }
        match self.peek() {
            Token::Identifier(_) | Token::Comma => {
                let values = self.identifier_list()?;
                match self.next() {
                    Token::ClosedPar => Ok(values),
                    other => Err(format!("found '{}', expected: ')'", other.literal())),
                }
            }
            Token::ClosedPar => {
                self.next();
                Ok(BTreeSet::from([String::new()]))
            }
            other => Err(format!(
                "found '{}', expected: ',', ')' or identifier",
                other.literal()
            )),
        }
    }

    fn identifier_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut values = BTreeSet::new();
        loop {
            match self.next() {
                Token::Identifier(value) => {
                    values.insert(value);
                    match self.peek() {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(values),
                        other => {
                            return Err(format!(
                                "found '{}', expected: ',' or ')'",
                                other.literal()
                            ));
                        }
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.insert(String::new());
                    }
                    match self.peek() {
                        Token::ClosedPar => {
                            values.insert(String::new());
                            return Ok(values);
                        }
                        Token::Comma => {
                            self.next();
                            values.insert(String::new());
                        }
                        _ => {}
                    }
                }
                other => {
                    return Err(format!(
                        "found '{}', expected: ',' or identifier",
                        other.literal()
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect()
    }

    fn matches(selector: &str, pairs: &[(&str, &str)]) -> bool {
        LabelSelector::parse(selector)
            .expect("selector parses")
            .matches(Some(&labels(pairs)))
    }

    #[test]
    fn equality_and_inequality() {
        assert!(matches("app=web", &[("app", "web")]));
        assert!(matches("app==web,tier", &[("app", "web"), ("tier", "x")]));
        assert!(!matches("app=web", &[("app", "db")]));
        assert!(matches("app!=web", &[]));
        assert!(!matches("app!=web", &[("app", "web")]));
    }

    #[test]
    fn set_based_and_existence() {
        assert!(matches("env in (prod, dev)", &[("env", "dev")]));
        assert!(!matches("env notin (prod,dev)", &[("env", "dev")]));
        assert!(matches("env notin (prod)", &[]));
        assert!(matches("!env", &[]));
        assert!(!matches("env", &[]));
        assert!(matches("n>5", &[("n", "6")]));
        assert!(!matches("n<5", &[("n", "x")]));
    }

    #[test]
    fn errors_read_like_upstream() {
        for (selector, error) in [
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "a in",
                "unable to parse requirement: found '' expected: '('",
            ),
            ("a=b c", "found 'c', expected: ',' or 'end of string'"),
            (
                ",",
                "found ',', expected: !, identifier, or 'end of string'",
            ),
        ] {
            assert_eq!(LabelSelector::parse(selector).err().as_deref(), Some(error));
        }
        assert!(LabelSelector::parse("-a").expect_err("must fail").starts_with(
            "unable to parse requirement: <nil>: Invalid value: \"-a\": name part must consist"
        ));
        assert!(
            LabelSelector::parse("app=a b")
                .expect_err("must fail")
                .starts_with("found 'b'")
        );
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(LabelSelector::parse("").expect("parses").is_empty());
        assert!(matches("", &[]));
    }
}
