"""``long-doc-qa``: a few long documents, each queried again and again with new questions.

A request picks a document (uniformly, or Zipf-popular with ``zipf_s > 0``) and appends a
fresh question; the documents (``D x L`` tokens) are the reused working set.
"""

from __future__ import annotations

from pydantic import Field

from kvstack.bench.workloads.base import RequestSpec, Workload, WorkloadParams
from kvstack.bench.workloads.zipf import ZipfSampler

__all__ = ["LongDocQA"]


class LongDocQAParams(WorkloadParams):
    num_documents: int = Field(default=4, gt=0, description="D: documents")
    document_tokens: int = Field(default=8000, gt=0, description="L: tokens per document")
    question_tokens: int = Field(default=50, gt=0, description="tokens per question")
    output_tokens: int = Field(default=50, gt=0, description="tokens per answer")
    zipf_s: float = Field(default=0.0, ge=0, description="document popularity skew (0: uniform)")


class LongDocQA(Workload[LongDocQAParams]):
    name = "long-doc-qa"
    params_cls = LongDocQAParams

    def setup(self) -> None:
        p = self.params
        self.documents = [
            self.builder.text(p.document_tokens, self.content_rng) for _ in range(p.num_documents)
        ]
        self.pick = ZipfSampler(p.num_documents, p.zipf_s)

    def next_request(self) -> RequestSpec:
        p = self.params
        doc = self.pick(self.rng)
        question = self.builder.text(p.question_tokens, self.rng)
        return self.spec([self.documents[doc], question], p.output_tokens, session=f"doc{doc}")

    def working_set_tokens(self) -> int:
        return self.params.num_documents * self.params.document_tokens
