//! One statement on either backend: tokio-postgres (a client, a transaction's client, a
//! pooled connection) or, feature `sqlx`, a sqlx connection or pool. Every protocol step
//! (begin, complete, save_final, acquire, renew, settle) is written once against `Db`:
//! its parameters as `Param`s, its rows as `Values`.

use std::time::SystemTime;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client as PgClient, Row, Statement};

use crate::error::Error;

/// One parameter of a protocol statement, as both backends send it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Param<'a> {
    /// text (NULL for None).
    Text(Option<&'a str>),
    /// text[] (NULL for None).
    Texts(Option<&'a [String]>),
    /// bytea (NULL for None).
    Bytes(Option<&'a [u8]>),
    /// int8 (NULL for None).
    Int8(Option<i64>),
    /// int4.
    Int4(i32),
    /// boolean.
    Bool(bool),
}

impl Param<'_> {
    /// The parameter as tokio-postgres takes it.
    fn as_pg(&self) -> &(dyn ToSql + Sync) {
        match self {
            Param::Text(value) => value,
            Param::Texts(value) => value,
            Param::Bytes(value) => value,
            Param::Int8(value) => value,
            Param::Int4(value) => value,
            Param::Bool(value) => value,
        }
    }
}

/// One column's value; None in a row stands for NULL.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    /// text (or any type read as text).
    Text(String),
    /// int2, int4 or int8.
    Int(i64),
    /// bytea.
    Bytes(Vec<u8>),
    /// boolean.
    Bool(bool),
    /// timestamptz (tokio-postgres only: the batch statements).
    Time(SystemTime),
}

/// The columns of one row, read by position; a column of another type reads as None.
#[derive(Clone, Debug, Default)]
pub(crate) struct Values(Vec<Option<Value>>);

impl Values {
    fn at(&self, index: usize) -> Option<&Value> {
        self.0.get(index).and_then(Option::as_ref)
    }

    /// A text column.
    pub(crate) fn text(&self, index: usize) -> Option<String> {
        match self.at(index) {
            Some(Value::Text(text)) => Some(text.clone()),
            _ => None,
        }
    }

    /// An integer column.
    pub(crate) fn int(&self, index: usize) -> Option<i64> {
        match self.at(index) {
            Some(Value::Int(number)) => Some(*number),
            _ => None,
        }
    }

    /// A bytea column.
    pub(crate) fn bytes(&self, index: usize) -> Option<Vec<u8>> {
        match self.at(index) {
            Some(Value::Bytes(bytes)) => Some(bytes.clone()),
            _ => None,
        }
    }

    /// A boolean column.
    pub(crate) fn flag(&self, index: usize) -> Option<bool> {
        match self.at(index) {
            Some(Value::Bool(flag)) => Some(*flag),
            _ => None,
        }
    }

    /// A timestamptz column.
    pub(crate) fn time(&self, index: usize) -> Option<SystemTime> {
        match self.at(index) {
            Some(Value::Time(time)) => Some(*time),
            _ => None,
        }
    }

    /// The columns of a tokio-postgres row, each by its type.
    pub(crate) fn of_pg(row: &Row) -> Result<Values, Error> {
        let mut values = Vec::with_capacity(row.len());
        for (index, column) in row.columns().iter().enumerate() {
            let value = match *column.type_() {
                Type::BOOL => row.try_get::<_, Option<bool>>(index)?.map(Value::Bool),
                Type::INT2 => row.try_get::<_, Option<i16>>(index)?.map(|n| Value::Int(n.into())),
                Type::INT4 => row.try_get::<_, Option<i32>>(index)?.map(|n| Value::Int(n.into())),
                Type::INT8 => row.try_get::<_, Option<i64>>(index)?.map(Value::Int),
                Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(index)?.map(Value::Bytes),
                Type::TIMESTAMPTZ => row.try_get::<_, Option<SystemTime>>(index)?.map(Value::Time),
                _ => row.try_get::<_, Option<String>>(index)?.map(Value::Text),
            };
            values.push(value);
        }
        Ok(Values(values))
    }

    /// The columns of a sqlx row, each by its type.
    #[cfg(feature = "sqlx")]
    fn of_sqlx(row: &sqlx::postgres::PgRow) -> Result<Values, Error> {
        use sqlx::{Column, Row as _, TypeInfo};
        let mut values = Vec::with_capacity(row.len());
        for (index, column) in row.columns().iter().enumerate() {
            let value = match column.type_info().name() {
                "BOOL" => row.try_get::<Option<bool>, _>(index)?.map(Value::Bool),
                "INT2" => row.try_get::<Option<i16>, _>(index)?.map(|n| Value::Int(n.into())),
                "INT4" => row.try_get::<Option<i32>, _>(index)?.map(|n| Value::Int(n.into())),
                "INT8" => row.try_get::<Option<i64>, _>(index)?.map(Value::Int),
                "BYTEA" => row.try_get::<Option<Vec<u8>>, _>(index)?.map(Value::Bytes),
                _ => row.try_get::<Option<String>, _>(index)?.map(Value::Text),
            };
            values.push(value);
        }
        Ok(Values(values))
    }
}

/// Where a statement runs.
pub(crate) enum Db<'a> {
    /// A tokio-postgres client (a transaction's: `Transaction::client`), with the
    /// statements prepared on its connection (`Connection`), each by its SQL.
    Pg(&'a PgClient, &'a [(&'static str, Statement)]),
    /// A sqlx connection (a transaction's: `&mut **tx`).
    #[cfg(feature = "sqlx")]
    Sqlx(&'a mut sqlx::PgConnection),
    /// A sqlx pool: the statement runs in a transaction of its own.
    #[cfg(feature = "sqlx")]
    SqlxPool(&'a sqlx::PgPool),
}

impl Db<'_> {
    /// Runs `sql` (prepared, when it was) with `params` and reads every row.
    pub(crate) async fn query(
        self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> Result<Vec<Values>, Error> {
        match self {
            Db::Pg(client, prepared) => {
                let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(Param::as_pg).collect();
                let rows = match prepared.iter().find(|(text, _)| *text == sql) {
                    Some((_, statement)) => client.query(statement, &params).await?,
                    None => client.query(sql, &params).await?,
                };
                rows.iter().map(Values::of_pg).collect()
            }
            #[cfg(feature = "sqlx")]
            Db::Sqlx(connection) => {
                let rows = sqlx_query(sql, params).fetch_all(connection).await?;
                rows.iter().map(Values::of_sqlx).collect()
            }
            #[cfg(feature = "sqlx")]
            Db::SqlxPool(pool) => {
                let rows = sqlx_query(sql, params).fetch_all(pool).await?;
                rows.iter().map(Values::of_sqlx).collect()
            }
        }
    }

    /// Runs `sql` and reads its first row (an error when there is none).
    pub(crate) async fn query_one(
        self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> Result<Values, Error> {
        let rows = self.query(sql, params).await?;
        rows.into_iter().next().ok_or_else(|| Error::Protocol("a statement returned no row".into()))
    }
}

/// `sql` with `params` bound, as sqlx sends it.
#[cfg(feature = "sqlx")]
fn sqlx_query<'q>(
    sql: &'static str,
    params: &[Param<'_>],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let mut query = sqlx::query(sql);
    for param in params {
        query = match *param {
            Param::Text(value) => query.bind(value.map(str::to_string)),
            Param::Texts(value) => query.bind(value.map(<[String]>::to_vec)),
            Param::Bytes(value) => query.bind(value.map(<[u8]>::to_vec)),
            Param::Int8(value) => query.bind(value),
            Param::Int4(value) => query.bind(value),
            Param::Bool(value) => query.bind(value),
        };
    }
    query
}
