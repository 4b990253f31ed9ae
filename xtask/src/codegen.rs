pub fn run(_check: bool) -> anyhow::Result<()> { anyhow::bail!("not yet") }
