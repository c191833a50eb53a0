# The bundle's Open MPI (Debian's packages unpacked with dpkg -x), relocated
# to this folder: source it, then mpirun runs from here.
GPU_CHECK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MPI_PREFIX="$GPU_CHECK/mpi/usr"
MPI_LIB="$MPI_PREFIX/lib/x86_64-linux-gnu"
export OPAL_PREFIX="$MPI_PREFIX"
export OPAL_LIBDIR="$MPI_LIB/openmpi/lib"
export PATH="$MPI_PREFIX/bin:$PATH"
export LD_LIBRARY_PATH="$MPI_LIB:$MPI_LIB/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One machine: shared memory between ranks, no network transports.
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx
export OMPI_MCA_mca_base_component_show_load_errors=0
# The bundle carries no zlib for PMIx: say nothing about it.
export PMIX_MCA_pcompress_base_silence_warning=1
MPI_INCLUDE="$MPI_LIB/openmpi/include"
