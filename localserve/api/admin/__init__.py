"""Operations routes: model management, stats, metrics, the OpenAPI document, fault injection."""
