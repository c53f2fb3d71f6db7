"""Fleet-wide prompt patterns found across tenants and conversations (`finder`), from the keyed prompt signatures of
sampled requests (`db.signatures`, stored by `db.signature_store`)."""
