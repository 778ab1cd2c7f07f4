//! Human-friendly byte sizes.

pub use carmine_localcluster::parse_size;

pub fn format_size(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (u, m) in UNITS {
        if n >= m && n.is_multiple_of(m) {
            return format!("{} {u}", n / m);
        }
        if n >= m {
            return format!("{:.1} {u}", n as f64 / m as f64);
        }
    }
    format!("{n} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("4M").unwrap(), 4 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert!(parse_size("5X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn sizes_format_readably() {
        assert_eq!(format_size(4 << 20), "4 MiB");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(10), "10 B");
    }
}
