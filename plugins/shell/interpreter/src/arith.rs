//! Arithmetic (`$((...))`, `((...))`, `for ((...))`): 64-bit integers that wrap, as bash's do.

use brush_parser::ast::{
    ArithmeticExpr, ArithmeticTarget, BinaryOperator, UnaryAssignmentOperator, UnaryOperator,
};

use crate::exec::Halt;
use crate::io::Streams;
use crate::{Shell, System};

impl<S: System> Shell<S> {
    /// Evaluates the text of an arithmetic expression, its parameters and substitutions
    /// expanded first.
    pub(crate) fn arithmetic(&mut self, text: &str, io: &Streams) -> Result<i64, Halt> {
        let expanded = self.expand_string(text, io)?;
        if expanded.trim().is_empty() {
            return Ok(0);
        }
        let nesting = crate::arithmetic_nesting(&expanded);
        crate::refuse_nesting(nesting).map_err(Halt::Fatal)?;
        self.nested(nesting, |sh| {
            let expr = brush_parser::arithmetic::parse(&expanded)
                .map_err(|e| Halt::Fatal(format!("bad arithmetic {expanded:?}: {e}")))?;
            sh.deeper(|sh| sh.eval(&expr))
        })
    }

    fn variable(&mut self, name: &str) -> Result<i64, Halt> {
        let value = self.vars.get(name).cloned().unwrap_or_default();
        let value = value.trim();
        if value.is_empty() {
            return Ok(0);
        }
        if let Ok(n) = value.parse::<i64>() {
            return Ok(n);
        }
        // A variable may hold an expression, as in bash; nesting is bounded.
        let nesting = crate::arithmetic_nesting(value);
        crate::refuse_nesting(nesting).map_err(Halt::Fatal)?;
        self.nested(nesting, |sh| {
            let expr = brush_parser::arithmetic::parse(value)
                .map_err(|e| Halt::Fatal(format!("{name}: bad arithmetic {value:?}: {e}")))?;
            sh.deeper(|sh| sh.eval(&expr))
        })
    }

    fn target(&mut self, target: &ArithmeticTarget) -> Result<String, Halt> {
        match target {
            ArithmeticTarget::Variable(name) => Ok(name.clone()),
            ArithmeticTarget::ArrayElement(..) => {
                Err(Halt::Fatal("arrays are not supported".into()))
            }
        }
    }

    fn eval(&mut self, expr: &ArithmeticExpr) -> Result<i64, Halt> {
        self.step()?;
        Ok(match expr {
            ArithmeticExpr::Literal(n) => *n,
            ArithmeticExpr::Reference(target) => {
                let name = self.target(target)?;
                self.variable(&name)?
            }
            ArithmeticExpr::UnaryOp(op, inner) => {
                let value = self.eval(inner)?;
                match op {
                    UnaryOperator::UnaryPlus => value,
                    UnaryOperator::UnaryMinus => value.wrapping_neg(),
                    UnaryOperator::BitwiseNot => !value,
                    UnaryOperator::LogicalNot => i64::from(value == 0),
                }
            }
            ArithmeticExpr::BinaryOp(BinaryOperator::LogicalAnd, left, right) => {
                i64::from(self.eval(left)? != 0 && self.eval(right)? != 0)
            }
            ArithmeticExpr::BinaryOp(BinaryOperator::LogicalOr, left, right) => {
                i64::from(self.eval(left)? != 0 || self.eval(right)? != 0)
            }
            ArithmeticExpr::BinaryOp(op, left, right) => {
                let left = self.eval(left)?;
                let right = self.eval(right)?;
                binary(*op, left, right)?
            }
            ArithmeticExpr::Conditional(cond, then, otherwise) => {
                if self.eval(cond)? != 0 {
                    self.eval(then)?
                } else {
                    self.eval(otherwise)?
                }
            }
            ArithmeticExpr::Assignment(target, value) => {
                let name = self.target(target)?;
                let value = self.eval(value)?;
                self.set_var(&name, value.to_string())?;
                value
            }
            ArithmeticExpr::BinaryAssignment(op, target, value) => {
                let name = self.target(target)?;
                let old = self.variable(&name)?;
                let value = self.eval(value)?;
                let new = binary(*op, old, value)?;
                self.set_var(&name, new.to_string())?;
                new
            }
            ArithmeticExpr::UnaryAssignment(op, target) => {
                let name = self.target(target)?;
                let old = self.variable(&name)?;
                let (new, result) = match op {
                    UnaryAssignmentOperator::PrefixIncrement => {
                        (old.wrapping_add(1), old.wrapping_add(1))
                    }
                    UnaryAssignmentOperator::PrefixDecrement => {
                        (old.wrapping_sub(1), old.wrapping_sub(1))
                    }
                    UnaryAssignmentOperator::PostfixIncrement => (old.wrapping_add(1), old),
                    UnaryAssignmentOperator::PostfixDecrement => (old.wrapping_sub(1), old),
                };
                self.set_var(&name, new.to_string())?;
                result
            }
        })
    }
}

fn binary(op: BinaryOperator, left: i64, right: i64) -> Result<i64, Halt> {
    Ok(match op {
        BinaryOperator::Power => {
            if right < 0 {
                return Err(Halt::Fatal("exponent less than 0".into()));
            }
            left.wrapping_pow(u32::try_from(right).unwrap_or(u32::MAX))
        }
        BinaryOperator::Multiply => left.wrapping_mul(right),
        BinaryOperator::Divide | BinaryOperator::Modulo if right == 0 => {
            return Err(Halt::Fatal("division by 0".into()));
        }
        BinaryOperator::Divide => left.wrapping_div(right),
        BinaryOperator::Modulo => left.wrapping_rem(right),
        BinaryOperator::Comma => right,
        BinaryOperator::Add => left.wrapping_add(right),
        BinaryOperator::Subtract => left.wrapping_sub(right),
        BinaryOperator::ShiftLeft => left.wrapping_shl((right & 63) as u32),
        BinaryOperator::ShiftRight => left.wrapping_shr((right & 63) as u32),
        BinaryOperator::LessThan => i64::from(left < right),
        BinaryOperator::LessThanOrEqualTo => i64::from(left <= right),
        BinaryOperator::GreaterThan => i64::from(left > right),
        BinaryOperator::GreaterThanOrEqualTo => i64::from(left >= right),
        BinaryOperator::Equals => i64::from(left == right),
        BinaryOperator::NotEquals => i64::from(left != right),
        BinaryOperator::BitwiseAnd => left & right,
        BinaryOperator::BitwiseXor => left ^ right,
        BinaryOperator::BitwiseOr => left | right,
        BinaryOperator::LogicalAnd => i64::from(left != 0 && right != 0),
        BinaryOperator::LogicalOr => i64::from(left != 0 || right != 0),
    })
}
